"""Two gateways, one store (issue 21): a model imported through gateway A is served by workers
that gateway B started. Each ``kiln up`` has its own data directory; they share one PostgreSQL
and an ``s3://`` artifact store on moto's standalone server, the only disk they have in common."""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from tests.e2e.conftest import KilnProcess, up_gateway

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.slow
MODEL = "tiny-shared"


def _tar(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(folder, arcname=folder.name)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def gateways(
    database_uri: str, s3_server: dict[str, str], new_bucket: Callable[[], str],
    kiln_data_dir: Callable[[], Any],
) -> Iterator[tuple[KilnProcess, KilnProcess]]:  # fmt: skip
    env = {**os.environ, **s3_server, "KILN_DATABASE_URL": database_uri,
           "KILN_ARTIFACT_STORE": new_bucket(), "KILN_SECRET_KEY": "shared-by-both-gateways",
           "KILN_LOG_LEVEL": "warning", "KILN_WARM_STANDBY": "false"}  # fmt: skip
    with kiln_data_dir() as dir_a, kiln_data_dir() as dir_b:
        a, b = up_gateway(dir_a, env), up_gateway(dir_b, env)
        try:
            a.wait_ready()
            b.wait_ready()
            a.cli("tenants", "create", "acme")
            out = a.cli("keys", "create", "--tenant", "acme", "--role", "platform-admin",
                        "--scope", "inference", "--scope", "admin:write")  # fmt: skip
            a.env["TEST_KEY"] = b.env["TEST_KEY"] = out.strip().splitlines()[-1]
            yield a, b
        finally:
            for kiln in (a, b):
                if kiln.proc.poll() is None:
                    kiln.stop()


def _import(kiln: KilnProcess, folder: Path) -> dict[str, Any]:
    """Import ``folder`` through ``kiln``'s admin API; returns its finished build job."""
    auth = {"authorization": f"Bearer {kiln.key}"}
    r = httpx.post(f"{kiln.base_url}/admin/v1/models/{MODEL}/versions", content=_tar(folder),
                   params={"precision": "fp32"}, headers=auth, timeout=120)  # fmt: skip
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = httpx.get(f"{kiln.base_url}/admin/v1/compile-jobs/{r.json()['id']}", headers=auth)
        if job.json()["status"] in ("done", "failed"):
            return dict(job.json())
        time.sleep(0.3)
    raise AssertionError("the build did not finish in 120 s")


def test_a_model_imported_through_a_is_served_by_workers_b_started(
    gateways: tuple[KilnProcess, KilnProcess], tiny_models: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:  # fmt: skip
    a, b = gateways
    folder = tiny_models.sentence(tmp_path_factory.mktemp("src") / "bert", "mean", normalize=True)
    job = _import(a, folder)
    assert job["status"] == "done", job
    client = openai.OpenAI(base_url=f"{b.base_url}/v1", api_key=b.key, max_retries=0, timeout=60)
    deadline = time.monotonic() + 60
    while True:
        try:
            out = client.embeddings.create(model=MODEL, input=["shared store", "two gateways"])
            break
        except openai.APIStatusError as exc:  # B has not seen the version yet, or it starts
            if time.monotonic() > deadline:
                raise AssertionError(f"gateway B never served it: {exc}") from exc
            time.sleep(0.5)
    assert len(out.data) == 2
    assert len(out.data[0].embedding) > 0
    workers = b.workers()
    assert workers, "gateway B served without a worker of its own"
    cache = Path(b.env["KILN_DATA_DIR"]) / "store" / "trees"
    assert any(str(cache) in " ".join(w.cmdline()) for w in workers)  # B's cache, from S3
