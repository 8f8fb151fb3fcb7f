"""The console's adapter upload is authorized before its multipart body is read: a member, a
stranger or a signed-out browser is answered without the server pulling a byte of it."""

from __future__ import annotations

from collections.abc import AsyncIterator

from .conftest import App, csrf

CHUNK = 256 << 10
SIZE = 32 * CHUNK  # 8 MiB
BOUNDARY = "kilnboundary"
MULTIPART = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
HEAD = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="weights"; '
        f'filename="adapter_model.safetensors"\r\n\r\n').encode()  # fmt: skip


class CountingBody:
    """A multipart body that records how many bytes the server pulled from it."""

    def __init__(self) -> None:
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.pulled += len(HEAD)
        yield HEAD
        for _ in range(SIZE // CHUNK):
            self.pulled += CHUNK
            yield b"\0" * CHUNK
        tail = f"\r\n--{BOUNDARY}--\r\n".encode()
        self.pulled += len(tail)
        yield tail


async def test_the_upload_is_refused_before_its_body_is_read(app: App) -> None:
    tenant, other = await app.tenant(), await app.tenant()
    member, owner = await app.user("tenant-member", tenant), await app.user("tenant-admin", tenant)
    cases = [(member, tenant, 403), (owner, other, 404)]
    for email, target, status in cases:
        async with app.signed_in(email) as (http, token):
            body = CountingBody()
            r = await http.post(f"/console/tenants/{target}/adapters", content=body,
                                headers={**MULTIPART, "x-csrftoken": token})  # fmt: skip
            assert (r.status_code, body.pulled) == (status, 0), (email, r.text[:200])
    async with app.client() as http:  # signed out, with a valid CSRF cookie and token
        token = csrf(await http.get("/console/login"))
        for headers, status in (({"x-csrftoken": token}, 303), ({}, 403)):
            body = CountingBody()
            r = await http.post(f"/console/tenants/{tenant}/adapters", content=body,
                                headers={**MULTIPART, **headers})  # fmt: skip
            assert (r.status_code, body.pulled) == (status, 0), (headers, r.text[:200])
    async with app.signed_in(owner) as (http, token):  # the measure works: the owner's is read
        body = CountingBody()
        r = await http.post(f"/console/tenants/{tenant}/adapters", content=body,
                            headers={**MULTIPART, "x-csrftoken": token})  # fmt: skip
        assert r.status_code == 400
        assert body.pulled > SIZE
