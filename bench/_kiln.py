"""A throw-away ``kiln up`` for benchmarks: fresh data dir, one model, a tenant and a key."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
import psutil


def free_port() -> int:
    """A free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_tree(proc: subprocess.Popen[bytes] | None, owned: list[psutil.Process]) -> None:
    """Ctrl-C ``proc``, wait (kill it after 60 s), then kill whichever of ``owned`` outlives a
    30 s grace period (only processes the caller started, by pid)."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _, alive = psutil.wait_procs(owned, timeout=30)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()


def register_as(env: dict[str, str], data_dir: Path, model_dir: Path,
                version: str = "bench") -> str:  # fmt: skip
    """``register_model`` in a child with ``env``: the code that will serve (a ``PYTHONPATH``
    baseline included) migrates the database, so its ``kiln up`` finds a schema it knows."""
    code = ("import asyncio, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
            " from _kiln import register_model; a, b = Path(sys.argv[2]), Path(sys.argv[3]);"
            " print(asyncio.run(register_model(a, b, sys.argv[4])))")  # fmt: skip
    here = str(Path(__file__).resolve().parent)
    out = subprocess.run([sys.executable, "-c", code, here, str(data_dir), str(model_dir),
                          version], env=env, capture_output=True, text=True, timeout=300,
                         check=False)  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"registering {model_dir} failed:\n{out.stderr}")
    return out.stdout.strip().splitlines()[-1]


async def register_model(data_dir: Path, model_dir: Path, version: str = "bench") -> str:
    """Register a built model folder in a data directory's database as ``version``; returns
    its name."""
    from kiln_platform.db.database import open_database
    from kiln_platform.registry.services import register_version
    from kiln_platform.settings import Settings
    from kiln_runtimes.protocol import ModelManifest
    from kiln_runtimes.store import ArtifactStore

    settings = Settings(data_dir=data_dir)
    manifest = msgspec.json.decode((model_dir / "kiln.json").read_bytes(), type=ModelManifest)
    digest = ArtifactStore(settings.store_dir).put_dir(model_dir)
    async with open_database(settings) as db, db.sessions.begin() as session:
        await register_version(session, manifest, version, digest)
    return manifest.name


@dataclass
class Kiln:
    """A running ``kiln up`` on a fresh data directory, and how to reach and stop it."""

    data_dir: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    base_url: str = ""
    key: str = ""
    model: str = ""
    _owned: list[psutil.Process] = field(default_factory=list)

    @classmethod
    def start(cls, model_dir: Path, extra_env: dict[str, str] | None = None) -> Kiln:
        """Register ``model_dir``, create a tenant and key with the CLI, start ``kiln up``."""
        data_dir = Path(tempfile.mkdtemp(prefix="kiln-bench-"))
        env = {**os.environ, "KILN_DATA_DIR": str(data_dir), "KILN_LOG_LEVEL": "warning"}
        env.pop("KILN_DATABASE_URL", None)
        env["KILN_METRICS_TOKEN"] = secrets.token_hex(16)  # tenant-labelled series need it
        env.update(extra_env or {})
        kiln = cls(data_dir, env)
        try:
            kiln.model = register_as(env, data_dir, model_dir)
            kiln.cli("tenants", "create", "bench")
            kiln.key = kiln.cli("keys", "create", "--tenant", "bench").strip().splitlines()[-1]
            port = free_port()
            kiln.base_url = f"http://127.0.0.1:{port}"
            kiln.proc = subprocess.Popen(
                [sys.executable, "-m", "kiln_console", "up", "--no-import", "--port", str(port)],
                env=env,
                stdout=subprocess.DEVNULL,
            )
            kiln.wait_until_serving()
        except BaseException:
            kiln.stop()
            raise
        return kiln

    def metrics_headers(self) -> dict[str, str]:
        """What a scrape of the gateway's every series (tenants' included) carries."""
        return {"authorization": f"Bearer {self.env['KILN_METRICS_TOKEN']}"}

    def cli(self, *args: str) -> str:
        """Run a ``kiln`` admin command on this data directory; returns stdout."""
        return subprocess.run(
            [sys.executable, "-m", "kiln_console", *args],
            env=self.env, capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip

    def wait_until_serving(self, timeout: float = 180) -> None:
        """Poll until the model answers an embeddings request."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.post(
                    f"{self.base_url}/v1/embeddings",
                    json={"model": self.model, "input": "warm up"},
                    headers={"authorization": f"Bearer {self.key}"},
                    timeout=5,
                )
                if r.status_code == 200:
                    self._owned = self.processes()
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(f"kiln up exited with {self.proc.returncode}")
            time.sleep(0.2)
        raise TimeoutError(f"{self.model} not serving after {timeout}s")

    def processes(self) -> list[psutil.Process]:
        """``kiln up``, its workers, and the embedded PostgreSQL serving this data directory."""
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        pg_dir = str(self.data_dir / "pg")
        for p in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if pg_dir in " ".join(p.info["cmdline"] or ()):
                    procs += [p, *p.children(recursive=True)]
        return list(dict.fromkeys(procs))

    def pids(self) -> dict[str, int]:
        """The gateway (``kiln up``) pid and the worker pids, for profiling."""
        out = {"gateway": self.proc.pid} if self.proc is not None else {}
        for p in self._owned:
            with contextlib.suppress(psutil.Error):
                if "kiln_runtimes" in " ".join(p.cmdline()):
                    out[f"worker {p.pid}"] = p.pid
        return out

    def roles(self) -> dict[str, list[psutil.Process]]:
        """This ``kiln up``'s processes by role: gateway, worker, standby (the preloaded spare,
        which serves nothing, kept out of the workers' figures), postgres."""
        out: dict[str, list[psutil.Process]] = {
            "gateway": [], "worker": [], "standby": [], "postgres": [],
        }  # fmt: skip
        for p in self.processes():
            with contextlib.suppress(psutil.Error):
                line = " ".join(p.cmdline())
                role = "worker" if "kiln_runtimes" in line else "gateway"
                role = "standby" if "--standby" in line else role
                role = "postgres" if "postgres" in line or p.name() == "postgres" else role
                out[role].append(p)
        return out

    def stop(self) -> None:
        """Ctrl-C ``kiln up`` and wait for its tree; kill what outlives a grace period."""
        stop_tree(self.proc, self._owned or self.processes())
        shutil.rmtree(self.data_dir, ignore_errors=True)


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """User + system CPU seconds of ``procs`` so far (ended ones count 0)."""
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            c = p.cpu_times()
            total += c.user + c.system
    return total


class CpuMeter:
    """CPU used by other processes on the machine while a measurement runs (in cores)."""

    def __init__(self, ours: list[psutil.Process]) -> None:
        self._ours = [psutil.Process(), *ours]

    def _sample(self) -> tuple[float, float, float]:
        t = psutil.cpu_times()
        busy = sum(t) - t.idle - getattr(t, "iowait", 0.0)
        mine = 0.0
        for p in self._ours:
            with contextlib.suppress(psutil.Error):
                c = p.cpu_times()
                mine += c.user + c.system + c.children_user + c.children_system
        return time.monotonic(), busy, mine

    def __enter__(self) -> CpuMeter:
        self._start = self._sample()
        self.foreign = 0.0
        self.ours = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._sample()
        wall = end[0] - self._start[0]
        self.ours = (end[2] - self._start[2]) / wall
        self.foreign = max(0.0, (end[1] - self._start[1]) / wall - self.ours)
