"""Password sources for rotating database credentials (``db.credentials``): a file re-read on
every call, RDS IAM tokens reused until close to expiry, and the settings that choose them."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from pydantic import ValidationError

from kiln_platform.db.credentials import (
    IAM_TOKEN_REUSE_S,
    IAM_TOKEN_TTL_S,
    CredentialsError,
    IamTokens,
    PasswordFile,
    iam_source,
    password_sources,
    rds_token_generator,
)
from kiln_platform.settings import Settings

APP_URL = "postgresql+asyncpg://kiln_app@db.example.internal:6543/kiln?ssl=require"


def test_a_password_file_is_read_on_every_call(tmp_path: Path) -> None:
    path = tmp_path / "password"
    path.write_text("first\n")
    source = PasswordFile(path)
    assert source() == "first"
    path.write_text("second")  # rotated: no newline this time
    assert source() == "second"
    path.unlink()
    with pytest.raises(CredentialsError, match="password file"):
        source()


async def test_iam_tokens_are_reused_until_the_margin_before_expiry() -> None:
    now = [0.0]
    signed: list[tuple[str, int, str]] = []

    def generate(host: str, port: int, user: str) -> str:
        signed.append((host, port, user))
        return f"token-{len(signed)}"

    tokens = IamTokens(generate, "db", 5432, "kiln_app", clock=lambda: now[0])
    assert [await tokens(), await tokens()] == ["token-1", "token-1"]
    now[0] = IAM_TOKEN_REUSE_S - 1
    assert await tokens() == "token-1"
    now[0] = IAM_TOKEN_REUSE_S
    assert await tokens() == "token-2"
    assert signed == [("db", 5432, "kiln_app")] * 2
    assert IAM_TOKEN_TTL_S - IAM_TOKEN_REUSE_S >= 60  # never handed out in its last minute


def test_iam_source_takes_endpoint_and_user_from_the_url() -> None:
    source = iam_source(APP_URL, lambda *_: "t")
    assert (source.host, source.port, source.user) == ("db.example.internal", 6543, "kiln_app")
    with pytest.raises(CredentialsError, match="host and user"):
        iam_source("postgresql+asyncpg:///kiln", lambda *_: "t")


async def test_boto3_signs_a_token_for_the_url_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real signer: local, no request to AWS (static keys stand in for the pod's role)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    token = await iam_source(APP_URL, rds_token_generator())()
    parts = urlsplit(f"https://{token}")
    query = parse_qs(parts.query)
    assert parts.netloc == "db.example.internal:6543"
    assert query["Action"] == ["connect"]
    assert query["DBUser"] == ["kiln_app"]
    assert "eu-west-1/rds-db/aws4_request" in query["X-Amz-Credential"][0]


def test_settings_choose_the_sources(tmp_path: Path) -> None:
    app_file, owner_file = tmp_path / "app", tmp_path / "owner"
    app_file.write_text("a")
    owner_file.write_text("o")
    settings = Settings(
        data_dir=tmp_path, database_url=APP_URL, database_password_file=app_file,
        database_owner_url=APP_URL, database_owner_password_file=owner_file,
    )  # fmt: skip
    app, owner = password_sources(settings, APP_URL, settings.database_owner_url)
    assert isinstance(app, PasswordFile)
    assert isinstance(owner, PasswordFile)
    assert (app(), owner()) == ("a", "o")
    alone = Settings(data_dir=tmp_path, database_url=APP_URL, database_password_file=app_file)
    app, owner = password_sources(alone, APP_URL, None)
    assert app is owner  # no owner URL: the app's URL migrates too
    plain = Settings(data_dir=tmp_path, database_url=APP_URL)
    assert password_sources(plain, APP_URL, None) == (None, None)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"database_iam": "rds", "database_password_file": "/p"}, "not both"),
        ({"database_url": None, "database_password_file": "/p"}, "need a database URL"),
        ({"database_owner_password_file": "/p"}, "needs KILN_DATABASE_OWNER_URL"),
    ],
)
def test_settings_refuse_credentials_that_cannot_apply(
    tmp_path: Path, fields: dict[str, str | None], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(data_dir=tmp_path, **{"database_url": APP_URL, **fields})  # type: ignore[arg-type]
