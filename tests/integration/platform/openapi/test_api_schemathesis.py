"""schemathesis against the whole OpenAPI document of a running app (``/v1``, ``/v2``,
``/admin/v1``, ``/oauth``; uvicorn on a free port, a fresh database, a real worker serving the
``mlp`` tensor model) with a platform-admin key that may also infer: no 5xx, and every response
conforms to the document (status, schema and content type). Bounded: a few examples per
operation; every operation with a ``name`` path parameter runs twice, once with generated names
and once naming the served model, so ``/v2`` inference reaches the worker."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from pydantic import SecretStr
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.result import Ok

from kiln_console.compose import create_app
from kiln_platform.admin.authz import Actor, Role
from kiln_platform.db.database import open_database
from kiln_platform.settings import Settings
from tests.factories import make_root_key

CLI = Actor("cli:schemathesis", Role.PLATFORM_ADMIN, None)
EXAMPLES = 20
NAMED = ("{name}", "{model_id}")
UNKNOWN_NAMES = 5
"""Examples of an operation naming a model by a generated name: each is the same 404 after the
resolver's miss wait (``MISS_REFRESH_S``), so more would add time and no case (a ``{name}``
operation runs again naming the served model, ``EXAMPLES`` times)."""
CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    content_type_conformance,
    status_code_conformance,
]


async def _root_key(settings: Settings) -> str:
    async with open_database(settings) as db, db.sessions.begin() as session:
        made = await make_root_key(session, settings.hmac_key(), actor=CLI)
    return made.secret


@pytest.fixture(scope="module")
def server(
    database_uri: str, tmp_path_factory: pytest.TempPathFactory, tensor_models: dict[str, Path]
) -> Iterator[tuple[str, str]]:
    """A uvicorn-served app in a thread serving ``mlp``; yields its base URL and a key."""
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("schemathesis-secret"), log_level="error",
    )  # fmt: skip
    key = asyncio.run(_root_key(settings))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="error")
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not served.started:
        assert time.monotonic() < deadline, "the app did not start"
        assert thread.is_alive(), "the app did not start"
        time.sleep(0.05)
    try:
        _serve_mlp(base, key, tensor_models["mlp"])
        yield base, key
    finally:
        served.should_exit = True
        thread.join(timeout=30)


def _serve_mlp(base: str, key: str, model: Path) -> None:
    """Upload the MLP and wait until a worker serves it."""
    auth = {"authorization": f"Bearer {key}"}
    r = httpx.post(
        f"{base}/admin/v1/models/{MODEL}/versions", content=model.read_bytes(), headers=auth,
        timeout=60,
    )  # fmt: skip
    assert r.status_code == 201, r.text
    deadline = time.monotonic() + 120
    while httpx.get(f"{base}/v2/models/{MODEL}/ready", headers=auth).status_code != 200:
        assert time.monotonic() < deadline, "the mlp worker did not get ready"
        time.sleep(0.25)


MODEL = "mlp"
APIS = r"^/(v1|v2|admin/v1|oauth)/"


def test_api_conforms(server: tuple[str, str]) -> None:
    """Every operation of the four APIs, valid and invalid inputs (schemathesis' own pytest
    plugin does not load on pytest 9, so each operation runs as a hypothesis test here)."""
    base, key = server
    schema = schemathesis.openapi.from_url(f"{base}/docs/openapi.json")
    results = list(schema.include(path_regex=APIS).get_all_operations())
    assert all(isinstance(r, Ok) for r in results), [r for r in results if not isinstance(r, Ok)]
    operations = [r.ok() for r in results if isinstance(r, Ok)]
    prefixes = {op.path.split("/")[1] for op in operations}
    assert prefixes == {"v1", "v2", "admin", "oauth"}, prefixes
    assert len(operations) >= 40, [op.label for op in operations]
    failures: dict[str, str] = {}
    runs = [(op, mode, False) for op in operations for mode in GenerationMode]
    runs += [(op, GenerationMode.POSITIVE, True) for op in operations if "{name}" in op.path]
    for op, mode, served in runs:
        unknown = (
            mode == GenerationMode.POSITIVE and not served and any(n in op.path for n in NAMED)
        )

        @given(case=op.as_strategy(mode))
        @settings(
            max_examples=UNKNOWN_NAMES if unknown else EXAMPLES, deadline=None,
            derandomize=True, database=None, suppress_health_check=list(HealthCheck),
            phases=[Phase.generate],
        )  # fmt: skip
        def run(case: schemathesis.Case[Any]) -> None:
            if served:  # noqa: B023 (run() is called within this iteration)
                case.path_parameters = {**(case.path_parameters or {}), "name": MODEL}
                if "version" in case.path_parameters:
                    case.path_parameters["version"] = "1"
            case.call_and_validate(
                base_url=base, headers={"authorization": f"Bearer {key}"},
                checks=CHECKS, timeout=30,
            )  # fmt: skip

        try:
            run()
        except Unsatisfiable:  # no invalid input exists (e.g. no parameters at all)
            continue
        except (Exception, BaseExceptionGroup) as exc:  # collect them all
            label = f"{op.label} [{mode.value}{', served' if served else ''}]"
            failures[label] = str(exc)[:2000]
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())


def test_nul_characters_are_400(server: tuple[str, str]) -> None:
    """What schemathesis found: PostgreSQL refuses NUL in text, which was a 500."""
    base, key = server
    auth = {"authorization": f"Bearer {key}"}
    r = httpx.get(f"{base}/admin/v1/audit", params={"actor": "a\x00b"}, headers=auth)
    assert r.status_code == 400, r.text
    r = httpx.post(f"{base}/admin/v1/tenants", json={"name": "a\x00b"}, headers=auth)
    assert r.status_code == 400, r.text
