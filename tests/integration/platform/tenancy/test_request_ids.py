"""Request ids are the server's (the ledger records each request once by its id)."""

from __future__ import annotations

from .conftest import Admin


async def test_a_client_cannot_choose_the_request_id(admin: Admin, root: str) -> None:
    await admin.tenant(root, "request-ids")  # (this module's fixture audits its mutations)
    ids = set()
    for _ in range(2):
        r = await admin.call("GET", "/v1/models", root, headers={"x-request-id": "mine"})
        assert r.status_code == 200
        assert r.headers["x-client-request-id"] == "mine"
        assert r.headers["x-request-id"].startswith("req_")
        ids.add(r.headers["x-request-id"])
    assert len(ids) == 2
    r = await admin.call("GET", "/v1/models", root, headers={"x-request-id": "bad id!"})
    assert "x-client-request-id" not in r.headers
