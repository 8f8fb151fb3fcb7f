"""A full disk during an upload: the data directory on a 24 MiB tmpfs, models uploaded through
the real app sized so the disk fills at each step (receiving the body, staging, storing the
blob). Each answers 507 with a message and leaves the store, the scratch
directory and the database as they were; the app keeps serving (an upload that fits works).

Mounting needs root (CAP_SYS_ADMIN); elsewhere the test is skipped, saying so."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import SecretStr
from sqlalchemy import func, select

from kiln_console.compose import create_app
from kiln_platform.batches.tables import StoredFile
from kiln_platform.db.tables import CompileJob, ModelVersion
from kiln_platform.settings import Settings
from tests.asgi import asgi
from tests.factories import make_root_key

from .conftest import serving

TMPFS_BYTES = 24 << 20


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 24 MiB tmpfs to hold the data directory."""
    mount = tmp_path_factory.mktemp("small-disk")
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mount)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@dataclass
class Server:
    http: httpx.AsyncClient
    kiln: Any
    data_dir: Path

    def free(self) -> int:
        st = os.statvfs(self.data_dir)
        return st.f_bavail * st.f_frsize

    def files(self) -> set[str]:
        """Every file under the store and the scratch directory (empty folders aside)."""
        found: set[str] = set()
        for part in ("store", "tmp"):
            root = self.data_dir / part
            found |= {str(p.relative_to(self.data_dir)) for p in root.rglob("*") if p.is_file()}
        return found

    async def rows(self) -> tuple[int, int, int]:
        async with self.kiln.db.sessions() as session:
            versions = await session.scalar(select(func.count()).select_from(ModelVersion))
            jobs = await session.scalar(select(func.count()).select_from(CompileJob))
            files = await session.scalar(select(func.count()).select_from(StoredFile))
        return int(versions or 0), int(jobs or 0), int(files or 0)


@pytest.fixture(scope="module")
async def server(small_disk: Path, database_uri: str) -> AsyncIterator[Server]:
    settings = Settings(
        data_dir=small_disk, database_url=database_uri, pool_initial_replicas=0,
        secret_key=SecretStr("disk-full-secret"), max_upload_bytes=64 << 20,
    )  # fmt: skip
    app = create_app(settings)
    async with serving(app):
        kiln = app.state.kiln
        async with kiln.db.sessions.begin() as session:
            made = await make_root_key(session, settings.hmac_key())
        transport = httpx.ASGITransport(app=asgi(app))
        headers = {"authorization": f"Bearer {made.secret}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://kiln.test", headers=headers, timeout=60
        ) as http:
            yield Server(http, kiln, small_disk)


def onnx_model(size: int) -> bytes:
    """A valid ONNX model (``y = x + w``) of about ``size`` bytes (``w`` random, incompressible)."""
    n = max(size // 4, 1)
    w = numpy_helper.from_array(np.random.default_rng(size).random(n, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])], [w],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return bytes(model.SerializeToString())


def source_tar(size: int) -> bytes:
    """A Hugging Face folder to build (``config.json`` and a weights file of ``size`` bytes)."""
    config = b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}'
    weights = np.random.default_rng(size).bytes(size)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in (("config.json", config), ("model.safetensors", weights)):
            info = tarfile.TarInfo(f"src/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def assert_refused_and_nothing_left(server: Server, body: bytes, query: str) -> None:
    before_files, before_rows = server.files(), await server.rows()
    name = f"full-{uuid.uuid4().hex[:8]}"
    r = await server.http.post(f"/admin/v1/models/{name}/versions{query}", content=body)
    assert r.status_code == 507, r.text
    assert "disk is full" in r.json()["detail"]
    assert server.files() == before_files, "the upload left files behind"
    assert await server.rows() == before_rows, "the upload left rows behind"
    listed = await server.http.get("/admin/v1/models")
    assert name not in listed.text


@pytest.mark.parametrize("share", [1.3, 0.7, 0.4])
async def test_a_tensor_upload_that_fills_the_disk_is_507_and_leaves_nothing(
    server: Server, share: float
) -> None:
    """The body, its staged copy and the store's blob each take its size: at 1.3 of the free
    space the body does not fit, at 0.7 the staged copy, at 0.4 only the store's copy."""
    body = onnx_model(int(server.free() * share))
    await assert_refused_and_nothing_left(server, body, "")


async def test_a_build_source_that_fills_the_disk_is_507_and_leaves_nothing(
    server: Server,
) -> None:
    """The archive, its unpacked folder and the stored source: the store's copy fills it."""
    body = source_tar(int(server.free() * 0.4))
    await assert_refused_and_nothing_left(server, body, "?task=generate")


async def test_a_batch_file_that_fills_the_disk_is_507_and_leaves_nothing(
    server: Server,
) -> None:
    """``/v1/files``: the JSONL streams to scratch and moves into the store (no second copy)."""
    line = {"custom_id": "", "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "m", "input": "x" * 1000}}  # fmt: skip
    count = int(server.free() * 1.2) // 1100
    data = "".join(json.dumps(line | {"custom_id": f"r{i}"}) + "\n" for i in range(count))
    before_files, before_rows = server.files(), await server.rows()
    r = await server.http.post(
        "/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", data.encode())}
    )
    assert r.status_code == 507, r.text
    assert "disk is full" in r.json()["error"]["message"]
    assert server.files() == before_files
    assert await server.rows() == before_rows
    listed = await server.http.get("/v1/files")
    assert listed.json()["data"] == []


async def test_after_a_full_disk_an_upload_that_fits_is_stored(server: Server) -> None:
    r = await server.http.post("/admin/v1/models/fits/versions", content=onnx_model(4096))
    assert r.status_code == 201, r.text
    assert r.json()["artifact_digest"].startswith("sha256:")
