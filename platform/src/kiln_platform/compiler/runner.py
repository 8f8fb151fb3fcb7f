"""Runs compile jobs in the background: claim one, compile in a subprocess, record the end.

The compiler is ``python -m kiln_runtimes.compile`` in its own process, so the control plane never
imports an engine library and a crashing compiler cannot take the gateway down. Several runners
(``kiln up`` and ``kiln models compile``) share the queue safely: claims use SKIP LOCKED.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from typing import TYPE_CHECKING

import msgspec
import structlog
from sqlalchemy import text

from kiln_platform.compiler import builds, services
from kiln_platform.subprocess_env import child_environment
from kiln_runtimes.protocol import CompileReport

if TYPE_CHECKING:
    import uuid

    from kiln_platform.db.database import Database
    from kiln_platform.settings import Settings

log = structlog.get_logger("kiln.compiler")
_POLL_S = 1.0


class CompileRunner:
    """Claims and runs queued compile jobs one at a time."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self._db = db
        self._settings = settings
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.env = child_environment(os.environ)
        """The compiler's and builds' environment, taken once: not the gateway's secrets or
        database URL."""
        self._store = settings.store()

    def start(self) -> None:
        """Poll for jobs in the background."""
        self._task = asyncio.create_task(self._loop(), name="compile-runner")

    def poke(self) -> None:
        """A job was queued: look now rather than at the next poll."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop polling (a running compile subprocess is killed)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def run_once(self, only: uuid.UUID | None = None) -> bool:
        """Claim and run one job (``only`` that one); False if there was none to claim.

        The claim's connection holds the job's advisory lock until the job ends, so if this
        process is killed the lock goes with the connection and ``recover`` requeues the job.
        """
        async with self._db.engine.connect() as conn:
            async with conn.begin():
                job = await services.claim(conn, only, hold=True)
            if job is None:
                return False
            try:
                log.info(
                    f"{job.kind} started", job=str(job.id), target=job.target,
                    precision=job.precision,
                )  # fmt: skip
                try:
                    if job.kind == "build":
                        await builds.run(self._db, self._store, self._settings, self.env, job.id)
                        return True
                    report, reason = await self._compile(job)
                except asyncio.CancelledError:  # shutting down: hand the job back to the queue
                    async with conn.begin():
                        await services.requeue(conn, job.id)
                    raise
                async with conn.begin():
                    await services.finish(conn, job.id, report, reason)
                log.info("compile finished", job=str(job.id), ok=report is not None, reason=reason)
            finally:
                async with conn.begin():
                    await conn.execute(
                        text("SELECT pg_advisory_unlock(:k)"), {"k": services.lock_key(job.id)}
                    )
        return True

    async def recover(self) -> None:
        """Requeue jobs left running by a runner that died."""
        async with self._db.sessions.begin() as session:
            orphans = await services.recover(session)
        if orphans:
            log.warning("requeued compile jobs of a dead runner", jobs=[str(j) for j in orphans])

    async def _loop(self) -> None:
        while True:
            try:
                await self.recover()
                while await self.run_once():
                    pass
            except Exception:  # the next poll tries again
                log.exception("compile runner failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _POLL_S)

    async def _compile(self, job: services.ClaimedJob) -> tuple[CompileReport | None, str | None]:
        s = self._settings
        cmd = [
            sys.executable, "-m", "kiln_runtimes.compile",
            "--store-dir", str(s.store_dir),
            "--artifact-digest", job.artifact_digest,
            "--target", job.target,
            "--precision", job.precision,
            "--max-batch-size", str(s.worker_max_batch_size),
        ]  # fmt: skip
        if s.worker_threads:
            cmd += ["--threads", str(s.worker_threads)]
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=self.env
        )
        try:
            out, err = await proc.communicate()
        except asyncio.CancelledError:
            proc.kill()
            raise
        if proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            return None, (lines[-1] if lines else f"compiler exited with {proc.returncode}")[:2000]
        last = out.decode().strip().splitlines()[-1]
        return msgspec.json.decode(last, type=CompileReport), None
