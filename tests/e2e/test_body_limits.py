"""Oversized bodies against a real ``kiln up`` (uvicorn on loopback): a raw socket streams a
512 MiB chunked body made up on the fly and counts the bytes it got onto the wire before the
server answered 413 and hung up. The count includes what the two kernels' socket buffers took
in, so it is bounded by the limit plus those buffers, never by the 512 MiB."""

from __future__ import annotations

import json
import select
import shutil
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import msgspec
import pytest

from kiln_runtimes.protocol import MANIFEST_NAME

from .pgdata import copy_migrated_pg

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from kiln_runtimes.protocol import ModelManifest
    from tests.e2e.conftest import KilnProcess

pytestmark = pytest.mark.slow

JSON_LIMIT = 4 << 20  # the default KILN_MAX_JSON_BODY_BYTES
TENSOR_LIMIT = 8 << 20
ADMIN_LIMIT = 1 << 20
HUGE = 512 << 20
SOCKET_BUFFERS = 8 << 20
"""Generous room for what loopback send and receive buffers hold beyond what the app read."""
FRAME = b"%x\r\n" % (64 << 10) + b"x" * (64 << 10) + b"\r\n"


@pytest.fixture(scope="module")
def kiln(
    start_kiln: Callable[..., KilnProcess], tensor_models: dict[str, Path],
    mlp_manifest: ModelManifest,
) -> Iterator[KilnProcess]:  # fmt: skip
    """``kiln up`` with the MLP test model registered as ``limited``, and a platform key."""
    path = Path(tempfile.mkdtemp(prefix="kiln-e2e-"))
    model = path / "model-src"
    model.mkdir()
    manifest = msgspec.structs.replace(mlp_manifest, name="limited")
    (model / MANIFEST_NAME).write_bytes(msgspec.json.encode(manifest))
    shutil.copyfile(tensor_models["mlp"], model / manifest.model_file)
    env = {"KILN_POOL_INITIAL_REPLICAS": "0", "KILN_MAX_TENSOR_BODY_BYTES": str(TENSOR_LIMIT)}
    (path / "data").mkdir()
    copy_migrated_pg(path / "data" / "pg")
    proc = start_kiln(path / "data", [model], env)
    try:
        proc.cli("tenants", "create", "operators")
        out = proc.cli(
            "keys", "create", "--tenant", "operators", "--role", "platform-admin",
            "--scope", "inference", "--scope", "admin:write",
        )  # fmt: skip
        proc.env["TEST_KEY"] = out.strip().splitlines()[-1]
        yield proc
    finally:
        if proc.proc.poll() is None:
            proc.stop()
        shutil.rmtree(path, ignore_errors=True)


def stream(kiln: KilnProcess, path: str, headers: dict[str, str]) -> tuple[int, int, bytes]:
    """POST a chunked 512 MiB body until the server answers; (status, bytes sent, body).

    Before each frame it checks whether the answer has arrived, and stops sending when it has.
    """
    url = urlsplit(kiln.base_url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 10)  # count near the server
    sock.settimeout(30)
    sock.connect((url.hostname, url.port))
    lines = [f"POST {path} HTTP/1.1", f"host: {url.netloc}", "transfer-encoding: chunked",
             f"authorization: Bearer {kiln.key}", "content-type: application/json"]  # fmt: skip
    lines += [f"{k}: {v}" for k, v in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    sent, pending = 0, memoryview(FRAME)
    while sent < HUGE:
        readable, writable, _ = select.select([sock], [sock], [], 30)
        if readable:
            break
        assert writable, "the server neither read nor answered for 30 s"
        n = sock.send(pending)  # may be part of a frame: the next send goes on from there
        sent, pending = sent + n, pending[n:] or memoryview(FRAME)
    answer = b""
    with sock:
        while b"\r\n\r\n" not in answer or len(answer) < _length(answer):
            chunk = sock.recv(1 << 16)
            assert chunk, f"the server hung up after {answer!r}"
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, sent, body


def _length(answer: bytes) -> int:
    """The size of a complete answer (headers, and the body its Content-Length announces)."""
    head, _, _ = answer.partition(b"\r\n\r\n")
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    raise AssertionError(f"no content-length in {head!r}")


@pytest.mark.parametrize("idempotency_key", [None, "e2e-huge"])
def test_512_mib_to_embeddings_is_refused_at_the_limit(
    kiln: KilnProcess, idempotency_key: str | None
) -> None:
    headers = {"idempotency-key": idempotency_key} if idempotency_key else {}
    status, sent, body = stream(kiln, "/v1/embeddings", headers)
    print(f"/v1/embeddings key={idempotency_key}: 413 after {sent / (1 << 20):.1f} MiB sent")
    assert status == 413
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert sent <= JSON_LIMIT + SOCKET_BUFFERS


def test_512_mib_to_v2_infer_is_refused_at_its_limit(kiln: KilnProcess) -> None:
    status, sent, body = stream(kiln, "/v2/models/limited/infer", {})
    print(f"/v2 infer: 413 after {sent / (1 << 20):.1f} MiB sent")
    assert status == 413
    assert set(json.loads(body)) == {"error"}
    assert sent <= TENSOR_LIMIT + SOCKET_BUFFERS


def test_512_mib_to_an_admin_json_route_is_refused_at_1_mib(kiln: KilnProcess) -> None:
    status, sent, body = stream(kiln, "/admin/v1/tenants", {})
    print(f"/admin/v1/tenants: 413 after {sent / (1 << 20):.1f} MiB sent")
    assert status == 413
    assert json.loads(body)["status"] == 413
    assert sent <= ADMIN_LIMIT + SOCKET_BUFFERS
