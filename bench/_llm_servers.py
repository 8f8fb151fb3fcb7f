"""The servers ``bench/llm.py`` starts (Kiln, llama-server, llama-cpp-python) and stops.

Each one listens on a free loopback port, logs to a file in the run's scratch directory, and is
stopped by pid (its own process tree, and for Kiln the embedded PostgreSQL of its data dir).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

import httpx
import psutil
from _kiln import cpu_seconds, free_port, register_model, stop_tree

REPO = Path(__file__).resolve().parent.parent


class Server:
    """A process tree serving an OpenAI-compatible ``/v1/chat/completions``."""

    name = "server"
    model = "model"
    key: str | None = None
    usage = True  # accepts ``stream_options.include_usage``

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._log: IO[bytes] | None = None
        self._owned: list[psutil.Process] = []

    def _spawn(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self._log = (self.logs / f"{self.name}.log").open("ab")
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    def wait_ready(self, timeout: float = 240) -> None:
        """Poll with a one-token chat completion until it answers 200."""
        assert self.proc is not None
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 1,
            "temperature": 0.0,
        }
        headers = {"authorization": f"Bearer {self.key}"} if self.key else {}
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise RuntimeError(f"{self.name} exited with {code}; see {self.log}")
            try:
                r = httpx.post(
                    f"{self.base_url}/v1/chat/completions", json=body, headers=headers, timeout=30
                )
                if r.status_code == 200:
                    self._owned = self.processes()
                    return
                last = f"{r.status_code} {r.text[:200]}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.3)
        raise TimeoutError(f"{self.name} not serving after {timeout}s ({last}); see {self.log}")

    @property
    def log(self) -> Path:
        return self.logs / f"{self.name}.log"

    def processes(self) -> list[psutil.Process]:
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def owned(self) -> list[psutil.Process]:
        return self._owned or self.processes()

    def stop(self) -> None:
        stop_tree(self.proc, self.owned())
        if self._log is not None:
            self._log.close()


class LlamaServer(Server):
    """llama.cpp's own ``llama-server``: ``-np`` slots, continuous batching, CPU threads."""

    name = "llama-server"
    model = "smollm2"

    def __init__(
        self, logs: Path, binary: Path, gguf: Path, *, parallel: int, ctx: int, threads: int
    ) -> None:
        super().__init__(logs)
        self.command = [
            str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
            "-np", str(parallel), "-c", str(ctx), "--cont-batching",
            "-t", str(threads), "-tb", str(threads), "-a", self.model,
        ]  # fmt: skip

    def start(self) -> None:
        self._spawn(self.command)
        self.wait_ready()


class LlamaCppPython(Server):
    """``python -m llama_cpp.server`` (llama-cpp-python[server]) on the same GGUF."""

    name = "llama-cpp-python"
    model = "smollm2"

    def __init__(self, logs: Path, gguf: Path, *, ctx: int, threads: int) -> None:
        super().__init__(logs)
        self.command = [
            sys.executable, "-m", "llama_cpp.server", "--model", str(gguf),
            "--model_alias", self.model, "--host", "127.0.0.1", "--port", str(self.port),
            "--n_ctx", str(ctx), "--n_threads", str(threads), "--n_threads_batch", str(threads),
            "--verbose", "False",
            # Its default (True) makes every new request abort the one being generated, so
            # concurrent streams starve each other; off, requests queue and run one at a time.
            "--interrupt_requests", "False",
        ]  # fmt: skip

    def start(self) -> None:
        self._spawn(self.command)
        self.wait_ready()


class Kiln(Server):
    """``kiln up --no-import`` on a fresh /tmp data dir, the model registered, tenant + key by CLI.

    The data dir is made with ``tempfile.mkdtemp`` under /tmp: as root, pgserver runs PostgreSQL
    as an unprivileged user that must traverse every parent directory.
    """

    name = "kiln"

    def __init__(self, logs: Path, model_dir: Path, extra_env: dict[str, str] | None = None):
        super().__init__(logs)
        self.model_dir = model_dir
        self.data_dir = Path(tempfile.mkdtemp(prefix="kiln-bench-llm-"))
        env = {**os.environ, "KILN_DATA_DIR": str(self.data_dir), "KILN_LOG_LEVEL": "warning"}
        env.pop("KILN_DATABASE_URL", None)
        env.update(extra_env or {})
        self.env = env

    def cli(self, *args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "kiln_console", *args],
            env=self.env, capture_output=True, text=True, timeout=180, check=True,
        ).stdout  # fmt: skip

    def start(self) -> None:
        self.model = asyncio.run(register_model(self.data_dir, self.model_dir))
        self.cli("tenants", "create", "bench")
        self.key = self.cli("keys", "create", "--tenant", "bench").strip().splitlines()[-1]
        cmd = [sys.executable, "-m", "kiln_console", "up", "--no-import", "--port", str(self.port)]
        self._spawn(cmd, self.env)
        self.wait_ready()

    def processes(self) -> list[psutil.Process]:
        procs = super().processes()
        if not procs:
            return procs
        pg_dir = str(self.data_dir / "pg")
        for p in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if pg_dir in " ".join(p.info["cmdline"] or ()):
                    procs += [p, *p.children(recursive=True)]
        return list(dict.fromkeys(procs))

    def pids(self) -> dict[str, int]:
        """The gateway's pid and the serving worker's: not the ``--standby`` spare the pool keeps
        warm, which serves nothing (picking it made the worker's CPU column read 0.00)."""
        out = {"gateway": self.proc.pid} if self.proc is not None else {}
        for p in self.owned():
            with contextlib.suppress(psutil.Error):
                line = " ".join(p.cmdline())
                if "kiln_runtimes" in line and "--standby" not in line:
                    out["worker"] = p.pid
        return out

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def quiesce(procs: list[psutil.Process], *, idle: float = 0.05, timeout: float = 60) -> float:
    """Wait until ``procs`` use under ``idle`` of a core over 0.5 s; returns the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        before = cpu_seconds(procs)
        time.sleep(0.5)
        if (cpu_seconds(procs) - before) / 0.5 < idle:
            break
    return time.monotonic() - start
