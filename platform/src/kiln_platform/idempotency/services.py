"""The idempotency store: claim a key atomically, store the first response, replay it.

A row of ``idempotency_keys`` is either a claim (``status`` NULL, ``locked_until`` renewed while
its request runs) or a stored response (``status``, ``headers``, sealed ``body``). A claim left
by a killed process lapses at ``locked_until``; a retry then takes the row over. Every row is
deleted ``ttl`` after it was claimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import structlog
from cryptography.exceptions import InvalidTag
from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert

from kiln_platform.billing.tables import IdempotencyKey
from kiln_platform.errors import Conflict, IdempotencyInProgress, IdempotencyKeyReused
from kiln_platform.idempotency._seal import Sealer

if TYPE_CHECKING:
    import hmac

    from sqlalchemy import ColumnElement
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

log = structlog.get_logger("kiln.idempotency")
HEADER = "Idempotency-Key"
PRUNE_EVERY_S = 600.0
_K = IdempotencyKey


@dataclass(frozen=True, slots=True)
class KeyScope:
    """What a key is unique within: tenant, credential, method and path (the primary key)."""

    tenant_id: uuid.UUID
    credential: str
    method: str
    path: str
    key: str

    def where(self) -> list[ColumnElement[bool]]:
        """The row's primary key as SQL conditions."""
        return [
            _K.tenant_id == self.tenant_id, _K.credential == self.credential,
            _K.method == self.method, _K.path == self.path, _K.key == self.key,
        ]  # fmt: skip

    def identity(self) -> bytes:
        """The associated data its stored body is sealed with."""
        parts = (str(self.tenant_id), self.credential, self.method, self.path, self.key)
        return "\x00".join(parts).encode()


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """The first response to a key: what a replay sends."""

    status: int
    headers: dict[str, str]
    body: bytes


class IdempotencyStore:
    """Claims, completions, replays and pruning, shared by every gateway through PostgreSQL."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], secret: bytes, *,
        ttl_s: float, lock_s: float,
    ) -> None:  # fmt: skip
        self._sessions = sessions
        self._sealer = Sealer(secret)
        self._ttl = timedelta(seconds=ttl_s)
        self.lock_s = lock_s
        self._task: asyncio.Task[None] | None = None

    def fingerprinter(self) -> hmac.HMAC:
        """A keyed SHA-256 to feed the request's query string and body into."""
        return self._sealer.fingerprinter()

    async def claim(
        self, scope: KeyScope, fingerprint: bytes, request_id: str
    ) -> StoredResponse | None:
        """None if this request now owns the key (run it); the stored response to replay; or
        ``IdempotencyKeyReused`` (another body) / ``IdempotencyInProgress`` (still running)."""
        for _ in range(5):  # a claim released between our INSERT and SELECT: try again
            if await self._insert(scope, fingerprint, request_id):
                return None
            async with self._sessions() as session:
                row = await session.scalar(select(_K).where(*scope.where()))
            if row is None:
                continue
            if row.fingerprint != fingerprint:
                raise IdempotencyKeyReused(
                    f"The {HEADER} header was already used with a different request body;"
                    " use a new key for a new request.",
                    param=HEADER,
                )
            if row.status is None or row.body is None:
                raise IdempotencyInProgress(
                    f"A request with this {HEADER} is still being processed; retry later.",
                    param=HEADER, retry_after=1.0,
                )  # fmt: skip
            try:
                body = self._sealer.open(row.body, scope.identity())
            except InvalidTag as exc:  # the server secret changed, or the row was tampered with
                log.warning("unreadable idempotent response", key=scope.key)
                raise Conflict(
                    f"The stored response for this {HEADER} cannot be read; use a new key.",
                    param=HEADER,
                ) from exc
            return StoredResponse(row.status, dict(row.headers or {}), body)
        raise IdempotencyInProgress(f"The {HEADER} is contended; retry.", retry_after=1.0)

    async def _insert(self, scope: KeyScope, fingerprint: bytes, request_id: str) -> bool:
        """One atomic statement: a new row, or a take-over of an expired row or lapsed claim."""
        now = func.now()
        values = {
            "fingerprint": fingerprint, "request_id": request_id, "status": None,
            "headers": None, "body": None, "created_at": now, "expires_at": now + self._ttl,
            "locked_until": now + timedelta(seconds=self.lock_s),
        }  # fmt: skip
        new = insert(_K).values(
            tenant_id=scope.tenant_id, credential=scope.credential, method=scope.method,
            path=scope.path, key=scope.key, **values,
        )  # fmt: skip
        stmt = new.on_conflict_do_update(
            constraint="pk_idempotency_keys",
            set_=values,
            where=or_(_K.expires_at <= now, and_(_K.status.is_(None), _K.locked_until <= now)),
        ).returning(_K.request_id)
        async with self._sessions.begin() as session:
            return (await session.scalar(stmt)) is not None

    async def complete(self, scope: KeyScope, request_id: str, response: StoredResponse) -> None:
        """Store the first response (sealed) and drop the claim's lock."""
        sealed = self._sealer.seal(response.body, scope.identity())
        answer = {"status": response.status, "headers": response.headers, "body": sealed}
        async with self._sessions.begin() as session:
            await session.execute(
                update(_K)
                .where(*scope.where(), _K.request_id == request_id, _K.status.is_(None))
                .values(locked_until=None, **answer)
            )

    async def release(self, scope: KeyScope, request_id: str) -> None:
        """Give the key up without storing an answer, so a retry runs the request afresh."""
        async with self._sessions.begin() as session:
            await session.execute(
                delete(_K).where(*scope.where(), _K.request_id == request_id, _K.status.is_(None))
            )

    async def renew(self, scope: KeyScope, request_id: str) -> None:
        """Extend a running request's claim by ``lock_s``."""
        async with self._sessions.begin() as session:
            await session.execute(
                update(_K)
                .where(*scope.where(), _K.request_id == request_id, _K.status.is_(None))
                .values(locked_until=func.now() + timedelta(seconds=self.lock_s))
            )

    async def prune(self) -> int:
        """Delete expired keys; returns how many."""
        async with self._sessions.begin() as session:
            result = await session.execute(delete(_K).where(_K.expires_at <= func.now()))
        return int(result.rowcount)  # type: ignore[attr-defined]

    def start(self) -> None:
        """Prune every ``PRUNE_EVERY_S`` seconds in the background."""
        self._task = asyncio.create_task(self._prune_loop(), name="idempotency-prune")

    async def stop(self) -> None:
        """Stop pruning."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _prune_loop(self) -> None:
        while True:
            try:
                if pruned := await self.prune():
                    log.info("pruned idempotency keys", count=pruned)
            except Exception:  # a database blip must not end the loop
                log.exception("pruning idempotency keys failed")
            await asyncio.sleep(PRUNE_EVERY_S)
