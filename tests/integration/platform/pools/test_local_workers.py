"""The ``local`` backend's real worker processes: what they inherit from the gateway (read from
``/proc/<pid>/environ``) and that they answer only calls carrying the worker secret."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgspec
import psutil
import pytest
from pydantic import SecretStr

from kiln_platform.pools.backend import PoolSpec, PoolWorker, worker_headers
from kiln_platform.pools.local import LocalPoolBackend
from kiln_platform.settings import Settings
from kiln_runtimes.protocol import ErrorReply, WorkerInfo

SERVER_SECRET = "server-secret-never-in-a-worker"
DATABASE_URL = "postgresql://kiln:db-password-never-in-a-worker@db:5432/kiln"
GATEWAY_ONLY = {
    "KILN_SECRET_KEY": SERVER_SECRET,
    "KILN_DATABASE_URL": DATABASE_URL,
    "KILN_OIDC_CLIENT_SECRET": "oidc-secret-never-in-a-worker",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-never-in-a-worker",
}
"""The gateway's environment that no worker may see."""


def environ(pid: int) -> dict[str, str]:
    """A running process's environment, as the kernel holds it."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if item)


def cmdline(pid: int) -> bytes:
    """A running process's command line (what ``ps`` shows)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes()


@pytest.fixture
async def worker(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Settings, PoolWorker]]:
    for name, value in GATEWAY_ONLY.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    settings = Settings(data_dir=tmp_path / "data", secret_key=SecretStr(SERVER_SECRET),
                        warm_standby=False, worker_threads=1)  # fmt: skip
    async with backend(settings) as pools:
        yield settings, await started(pools, PoolSpec("mlp", "1", model_dir))


@contextlib.asynccontextmanager
async def backend(settings: Settings) -> AsyncIterator[LocalPoolBackend]:
    """A ``local`` backend, stopped (with its workers) at the end."""
    async with aiohttp.ClientSession(headers=worker_headers(settings)) as http:
        pools = LocalPoolBackend(settings, http)
        try:
            yield pools
        finally:
            await pools.stop()


async def started(pools: LocalPoolBackend, spec: PoolSpec) -> PoolWorker:
    """``spec``'s pool with one worker, once it is ready."""
    pools.ensure(spec)
    pools.scale(spec.key, 1)
    deadline = time.monotonic() + 60
    while not pools.ready(spec.key):  # readiness is the gateway's /health call, with secret
        assert time.monotonic() < deadline, "the worker never became ready"
        await asyncio.sleep(0.05)
    return pools.ready(spec.key)[0]


def policies(pid: int) -> set[int]:
    """The scheduling policy of each thread of a process, from ``/proc/<pid>/task/*/stat``
    (field 41: 0 ``SCHED_OTHER``, 5 ``SCHED_IDLE``)."""
    found = set()
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            fields = stat.read_text().rpartition(")")[2].split()
            found.add(int(fields[41 - 3]))
    return found


async def test_a_worker_inherits_only_what_it_needs(worker: tuple[Settings, PoolWorker]) -> None:
    settings, running = worker
    assert running.process is not None
    env = environ(running.process.pid)
    assert env["KILN_WORKER_SECRET"] == settings.worker_key()
    assert settings.worker_key() != SERVER_SECRET
    assert not [k for k in env if k in GATEWAY_ONLY]
    leaked = [k for k, v in env.items() for secret in GATEWAY_ONLY.values() if secret in v]
    assert not leaked
    assert [k for k in env if k.startswith("KILN_")] == ["KILN_WORKER_SECRET"]
    assert (env["OMP_NUM_THREADS"], env["LC_ALL"]) == ("1", "C.UTF-8")
    assert env["PATH"]
    # and not on its command line either, where ``ps`` shows it
    assert settings.worker_key().encode() not in cmdline(running.process.pid)


async def test_the_worker_refuses_calls_without_the_secret(
    worker: tuple[Settings, PoolWorker],
) -> None:
    settings, running = worker
    wrong = Settings(data_dir=Path("/nonexistent"), secret_key=SecretStr("another deployment"))
    for headers in ({}, worker_headers(wrong), {"authorization": f"Bearer {SERVER_SECRET}"}):
        async with (
            aiohttp.ClientSession(headers=headers) as stranger,
            stranger.get(f"{running.url}/health") as refused,
        ):
            assert refused.status == 401
            assert msgspec.msgpack.decode(await refused.read(), type=ErrorReply).code == (
                "unauthorized"
            )
    async with (
        aiohttp.ClientSession(headers=worker_headers(settings)) as gateway,
        gateway.get(f"{running.url}/health") as answered,
    ):
        assert answered.status == 200
        assert msgspec.msgpack.decode(await answered.read(), type=WorkerInfo).ready


async def test_an_idle_pools_workers_run_every_thread_at_idle_priority(
    model_dir: Path, tmp_path: Path
) -> None:
    """A shadow candidate's or background twin's pool (``PoolSpec.idle``) beside a served one,
    its worker the warm standby (whose preloading started threads before it was assigned)."""
    settings = Settings(data_dir=tmp_path / "data", secret_key=SecretStr(SERVER_SECRET),
                        warm_standby=True, worker_threads=1)  # fmt: skip
    async with backend(settings) as pools:
        normal = await started(pools, PoolSpec("mlp", "1", model_dir))
        deadline = time.monotonic() + 30
        # made once the first worker is ready; handed out only once the pools hold it (its
        # process shows a moment before the spawn returns to them)
        while not (standbys := _standbys()) or pools._standby is None:
            assert time.monotonic() < deadline, "no standby worker"
            await asyncio.sleep(0.05)
        idle = await started(pools, PoolSpec("mlp", "2", model_dir, idle=True))
        assert normal.process is not None
        assert idle.process is not None
        assert idle.process.pid in standbys
        assert len(os.listdir(f"/proc/{idle.process.pid}/task")) > 1
        assert policies(normal.process.pid) == {os.SCHED_OTHER}
        assert policies(idle.process.pid) == {os.SCHED_IDLE}


def _standbys() -> set[int]:
    """This process's children that are standby workers."""
    return {p.pid for p in psutil.Process().children() if "--standby" in p.cmdline()}
