"""OAuth2 client credentials against a real ``kiln up``: a client made with the CLI, a token from
authlib's own httpx client, the ``openai`` SDK using it, revocation refused within 5 s,
introspection, and key rotation with the old key still published."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import httpx
import openai
from authlib.integrations.httpx_client import OAuth2Client

from .conftest import MINILM, KilnProcess


def _header(token: str) -> dict[str, Any]:
    raw = token.split(".", maxsplit=1)[0]
    return dict(json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))))


def _models(kiln: KilnProcess, token: str) -> int:
    r = httpx.get(f"{kiln.base_url}/v1/models", headers={"authorization": f"Bearer {token}"})
    return r.status_code


def test_oauth_client_credentials(kiln_up: KilnProcess) -> None:
    out = kiln_up.cli("oauth-clients", "create", "--tenant", "acme", "--name", "e2e")
    client_id, secret = out.strip().splitlines()[-2:]
    base = kiln_up.base_url
    found = httpx.get(f"{base}/.well-known/oauth-authorization-server").json()  # RFC 8414
    assert found["grant_types_supported"] == ["client_credentials"]
    assert found["jwks_uri"] == f"{base}/.well-known/jwks.json"
    with OAuth2Client(client_id, secret) as oauth:
        token = oauth.fetch_token(found["token_endpoint"], grant_type="client_credentials")
        access = token["access_token"]
        assert _header(access)["typ"] == "at+jwt"
        sdk = openai.OpenAI(base_url=f"{base}/v1", api_key=access)
        assert MINILM in [m.id for m in sdk.models.list()]
        assert len(sdk.embeddings.create(model=MINILM, input=["hi"]).data[0].embedding) == 384

        spare = oauth.fetch_token(f"{base}/oauth/token", grant_type="client_credentials")
        rotated = kiln_up.cli("oauth", "keys", "rotate").strip().rsplit(" ", 1)[-1]
        fresh = oauth.fetch_token(f"{base}/oauth/token", grant_type="client_credentials")
        assert _header(fresh["access_token"])["kid"] == rotated != _header(access)["kid"]
        kids = [k["kid"] for k in httpx.get(f"{base}/.well-known/jwks.json").json()["keys"]]
        assert {rotated, _header(access)["kid"]} <= set(kids)
        assert _models(kiln_up, spare["access_token"]) == 200  # signed by the retired key
        assert _models(kiln_up, fresh["access_token"]) == 200

        r = oauth.introspect_token(found["introspection_endpoint"], token=access)
        assert r.json()["active"] is True
        assert oauth.revoke_token(found["revocation_endpoint"], token=access).status_code == 200
        revoked_at = time.monotonic()
        while _models(kiln_up, access) != 401:
            assert time.monotonic() - revoked_at < 5.5, "revoked token still accepted after 5 s"
            time.sleep(0.1)
        r = oauth.introspect_token(f"{base}/oauth/introspect", token=access)
        assert r.json() == {"active": False}
        assert _models(kiln_up, spare["access_token"]) == 200  # only that token is revoked
