"""Shared fixtures: one embedded PostgreSQL per test session, a migrated template database,
and a fresh database cloned from it per test module."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import asyncpg
import pytest

from kiln_platform.db import migrate
from kiln_platform.db.engine import asyncpg_url, create_engine, embedded_server
from kiln_runtimes.protocol import ModelManifest, TensorSpec

# The gRPC service's port is one for all: apps and `kiln up`s of tests serve none unless a
# test gives them a free port (tests/e2e/test_tensor_grpc.py).
os.environ.setdefault("KILN_GRPC_PORT", "0")
T = TypeVar("T")
P = ParamSpec("P")
TEMPLATE = "kiln_template"
LAYERS = ("unit", "integration", "e2e", "deploy")


def off_loop(call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``call(*args, **kwargs)``, in a thread of its own when this one already runs a loop (an
    async test, or Playwright's sync API, which keeps one running in the test's thread): for
    work that runs a loop of its own (``asyncio.run``)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return call(*args, **kwargs)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call, *args, **kwargs).result()


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, even where a loop is running already (``off_loop``)."""
    return off_loop(asyncio.run, main)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its layer, the folder under ``tests/`` it lives in (``make
    test-unit`` etc. select one with ``-m``)."""
    root = Path(__file__).parent
    for item in items:
        layer = item.path.relative_to(root).parts[0]
        assert layer in LAYERS, f"{item.nodeid}: tests live under one of {LAYERS}"
        item.add_marker(getattr(pytest.mark, layer))


@pytest.fixture(scope="session")
def model_cache() -> Path:
    """Where built models are kept between test runs (never inside the repository)."""
    path = Path(os.environ.get("KILN_TEST_CACHE") or Path.home() / ".cache" / "kiln-test")
    path.mkdir(parents=True, exist_ok=True)
    return path


# Durability is not under test: without fsync a slow disk cannot stall a commit or a new
# connection (a CI run once saw a connect time out after 60 s), and the suite runs faster.
_NO_FSYNC = ("fsync", "synchronous_commit", "full_page_writes")


async def no_fsync(uri: str) -> None:
    """Turn durability off on the server at ``uri`` (from its next reload or start)."""
    conn = await asyncpg.connect(uri)
    try:
        for setting in _NO_FSYNC:
            await conn.execute(f"ALTER SYSTEM SET {setting} = off")
    finally:
        await conn.close()


async def _create_template(uri: str) -> None:
    await no_fsync(uri)
    conn = await asyncpg.connect(uri)
    try:
        await conn.execute("SELECT pg_reload_conf()")
        await conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}"')
        await conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
    finally:
        await conn.close()
    engine = create_engine(asyncpg_url(_with_db(uri, TEMPLATE)), pool_size=1)
    await migrate.upgrade(engine)
    await engine.dispose()


def _with_db(uri: str, name: str) -> str:
    base, _, query = uri.partition("?")
    return f"{base.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")


@pytest.fixture(scope="session")
def pg_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A libpq URI of the session's embedded PostgreSQL (migrated template created)."""
    with embedded_server(tmp_path_factory.mktemp("pg")) as uri:
        asyncio.run(_create_template(uri))
        yield uri


def new_database(pg_uri: str) -> str:
    """Clone the migrated template into a fresh database; returns its libpq URI."""
    name = f"t_{uuid.uuid4().hex[:12]}"

    async def create() -> None:
        conn = await asyncpg.connect(pg_uri)
        try:
            await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
        finally:
            await conn.close()

    asyncio.run(create())
    return _with_db(pg_uri, name)


@pytest.fixture(scope="module")
def database_uri(pg_uri: str) -> str:
    """A fresh, migrated database for one test module."""
    return new_database(pg_uri)


MLP_MANIFEST = ModelManifest(
    name="mlp", task="tensor", engine="onnxruntime", tokenizer_file=None, batching=True,
    inputs=[TensorSpec(name="x", datatype="FP32", shape=[-1, 16]),
            TensorSpec(name="scale", datatype="FP32", shape=[-1, 1])],
    outputs=[TensorSpec(name="y", datatype="FP32", shape=[-1, 4]),
             TensorSpec(name="norm", datatype="FP32", shape=[-1, 1])],
)  # fmt: skip


@pytest.fixture(scope="session")
def mlp_manifest() -> ModelManifest:
    """The manifest of the ``mlp`` tensor test model (inputs x, scale; outputs y, norm)."""
    return MLP_MANIFEST


def _fixture_module(name: str) -> Any:
    """A script of ``tests/fixtures`` as a module (that folder is not a package)."""
    script = Path(__file__).parent / "fixtures" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def oidc_provider() -> Iterator[Any]:
    """A running OpenID Connect provider (``tests/fixtures/oidc_provider.py``)."""
    provider, server, thread = _fixture_module("oidc_provider").serve()
    yield provider
    server.should_exit = True
    thread.join(timeout=30)


@pytest.fixture(scope="session")
def tensor_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tensor test models from ``tests/fixtures/make_tensor_models.py`` (name -> path)."""
    module = _fixture_module("make_tensor_models")
    built: dict[str, Path] = module.build(tmp_path_factory.mktemp("tensor-models"))
    return built


@pytest.fixture(scope="session")
def tiny_models() -> Any:
    """Tiny random-weight Hugging Face folders (``tests/fixtures/tiny_models.py``)."""
    return _fixture_module("tiny_models")


@pytest.fixture(scope="session")
def build_cli() -> Any:
    """Runs ``python -m kiln_runtimes.build`` (``tests/fixtures/build_cli.py``)."""
    return _fixture_module("build_cli")


@pytest.fixture(scope="session")
def peft() -> Any:
    """Made-up PEFT LoRA adapters (``tests/fixtures/peft_adapters.py``)."""
    return _fixture_module("peft_adapters")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, str]]:
    """moto's standalone S3 server on a free loopback port; yields the ``AWS_*`` settings that
    reach it (boto3 in this process and in ``kiln`` processes reads them from the environment)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, "moto_server exited"
            assert time.monotonic() < deadline, "moto_server did not listen in 30 s"
            time.sleep(0.05)
    yield {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="session")
def new_bucket(s3_server: dict[str, str]) -> Callable[[], str]:
    """Makes a fresh bucket on the ``s3_server``; returns its ``s3://<bucket>/kiln`` store URL."""
    import boto3

    aws = s3_server
    client = boto3.session.Session().client(
        "s3", endpoint_url=aws["AWS_ENDPOINT_URL"], region_name=aws["AWS_DEFAULT_REGION"],
        aws_access_key_id=aws["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=aws["AWS_SECRET_ACCESS_KEY"],
    )  # fmt: skip

    def make() -> str:
        name = f"kiln-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=name)
        return f"s3://{name}/kiln"

    return make
