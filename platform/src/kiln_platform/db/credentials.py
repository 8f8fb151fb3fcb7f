"""Database passwords that rotate without a restart: asyncpg asks for one on every new
connection (``connect(password=callable)``), so a source named here is consulted then.

- a file (``KILN_DATABASE_PASSWORD_FILE``, ``KILN_DATABASE_OWNER_PASSWORD_FILE``): re-read on
  each connect, so a mounted Kubernetes Secret that External Secrets or the kubelet rewrites
  takes effect at the next connection;
- RDS IAM (``KILN_DATABASE_IAM=rds``): a signed token from boto3 per connection, cached until
  close to its 15-minute expiry. boto3 is the ``aws`` extra, imported only in this mode.

Connections already open keep working after a rotation (PostgreSQL checks a password only when
a connection starts); the pool replaces them as they are recycled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.engine import make_url

if TYPE_CHECKING:
    from pathlib import Path

    from kiln_platform.settings import Settings

PasswordSource = Callable[[], str | Awaitable[str]]
"""What asyncpg calls (and awaits, if it is a coroutine) for each new connection's password."""
TokenGenerator = Callable[[str, int, str], str]
"""``(host, port, user) -> token``: boto3's ``generate_db_auth_token`` bound to a region."""

IAM_TOKEN_TTL_S = 900.0
"""How long an RDS IAM token is accepted after it is signed (AWS: 15 minutes)."""
IAM_TOKEN_REUSE_S = 600.0
"""How long one token is handed out: five minutes of margin before it expires."""


class CredentialsError(RuntimeError):
    """A password source cannot be used (an unreadable file, boto3 missing)."""


@dataclass(frozen=True, slots=True)
class PasswordFile:
    """A password kept in a file, read on every call (one trailing newline dropped)."""

    path: Path

    def __call__(self) -> str:
        try:
            text = self.path.read_text()
        except OSError as exc:
            raise CredentialsError(f"cannot read the database password file: {exc}") from exc
        return text.removesuffix("\n").removesuffix("\r")


@dataclass(slots=True)
class IamTokens:
    """RDS IAM tokens for one endpoint and user, each reused until ``reuse_s`` after signing.

    Signed in a thread: boto3 may first refresh the pod's credentials over the network (STS).
    """

    generate: TokenGenerator
    host: str
    port: int
    user: str
    reuse_s: float = IAM_TOKEN_REUSE_S
    clock: Callable[[], float] = time.monotonic
    _token: str | None = field(default=None, init=False)
    _signed_at: float = field(default=0.0, init=False)

    async def __call__(self) -> str:
        now = self.clock()
        if self._token is None or now - self._signed_at >= self.reuse_s:
            self._token = await asyncio.to_thread(self.generate, self.host, self.port, self.user)
            self._signed_at = now
        return self._token


def rds_token_generator() -> TokenGenerator:
    """boto3's token signer, for the region and credentials of the standard AWS settings (on
    EKS: the pod's IRSA role and ``AWS_REGION``). Signing is local: no request to AWS."""
    try:
        import boto3
    except ImportError as exc:
        raise CredentialsError(
            "KILN_DATABASE_IAM=rds needs boto3: install kiln-platform[aws]"
        ) from exc
    client = boto3.client("rds")

    def generate(host: str, port: int, user: str) -> str:
        token: str = client.generate_db_auth_token(DBHostname=host, Port=port, DBUsername=user)
        return token

    return generate


def iam_source(url: str, generate: TokenGenerator) -> IamTokens:
    """Tokens for the user and endpoint ``url`` names (``postgresql://user@host:port/db``)."""
    parsed = make_url(url)
    if not parsed.host or not parsed.username:
        raise CredentialsError("KILN_DATABASE_IAM=rds needs a host and user in the database URL")
    return IamTokens(generate, parsed.host, parsed.port or 5432, parsed.username)


def password_sources(
    settings: Settings, app_url: str, owner_url: str | None
) -> tuple[PasswordSource | None, PasswordSource | None]:
    """``(app, owner)`` password sources the settings name (``None``: the URL's password).

    Without an owner URL the app's URL migrates too, with the app's source.
    """
    app: PasswordSource | None = None
    if settings.database_password_file is not None:
        app = PasswordFile(settings.database_password_file)
    elif settings.database_iam == "rds":
        app = iam_source(app_url, rds_token_generator())
    if owner_url is None:
        return app, app
    owner_file = settings.database_owner_password_file
    return app, PasswordFile(owner_file) if owner_file is not None else None
