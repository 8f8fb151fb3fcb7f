"""Safe releases through the official openai SDK against one ``kiln up``: all-MiniLM-L6-v2
registered as versions 1 and 2 of ``m``; pinned versions and an alias moved under traffic, each
answer saying which version served it, then version 1 deprecated and retired."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path

import msgspec
import openai
import pytest

from kiln_platform.db.database import open_database
from kiln_platform.registry.services import register_version
from kiln_platform.settings import Settings
from kiln_runtimes.protocol import ModelManifest
from kiln_runtimes.store import ArtifactStore

from .conftest import KilnProcess, admin_call, use_platform_admin_key

VERSION = "x-kiln-model-version"


async def _register_twice(settings: Settings, model_dir: Path) -> None:
    manifest = msgspec.json.decode((model_dir / "kiln.json").read_bytes(), type=ModelManifest)
    manifest = msgspec.structs.replace(manifest, name="m")
    digest = ArtifactStore(settings.store_dir).put_dir(model_dir)
    async with open_database(settings) as db, db.sessions.begin() as session:
        for version in ("1", "2"):
            await register_version(session, manifest, version, digest)


@pytest.fixture(scope="module")
def kiln(
    start_kiln: Callable[..., KilnProcess],
    kiln_data_dir: Callable[[], AbstractContextManager[Path]],
    minilm_dir: Path,
) -> Iterator[KilnProcess]:
    """``kiln up`` serving ``m`` versions 1 and 2, with a platform-admin key that may infer."""
    with kiln_data_dir() as path:
        asyncio.run(_register_twice(Settings(data_dir=path), minilm_dir))
        kiln = start_kiln(path, [])
        try:
            use_platform_admin_key(kiln)
            kiln.wait_until_serving("m@1")
            kiln.wait_until_serving("m@2")
            yield kiln
        finally:
            if kiln.proc.poll() is None:
                kiln.stop()


@pytest.fixture(scope="module")
def client(kiln: KilnProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0)


def _ask(client: openai.OpenAI, model: str) -> tuple[str, str]:
    """(the version that answered, the response's ``model``)."""
    raw = client.embeddings.with_raw_response.create(model=model, input="hello")
    return raw.headers[VERSION], raw.parse().model


def test_pinned_versions_answer_and_say_which(client: openai.OpenAI) -> None:
    assert _ask(client, "m@1") == ("1", "m@1")
    assert _ask(client, "m@2") == ("2", "m@2")
    assert _ask(client, "m")[0] == "2"  # no route: the newest
    assert _ask(client, "m@stable")[0] == "2"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="m@7", input="hello")
    assert [card.id for card in client.models.list()] == ["m"]  # one model, two versions
    assert client.models.with_raw_response.retrieve("m@1").headers[VERSION] == "1"


def test_an_alias_moves_atomically_under_traffic(kiln: KilnProcess, client: openai.OpenAI) -> None:
    assert kiln.cli("models", "alias", "m", "prod", "1").strip() == "m@prod -> 1"
    assert _ask(client, "m@prod")[0] == "1"  # another process's change: found on the miss
    seen: list[str] = []
    stop = threading.Event()

    def send() -> None:
        while not stop.is_set():
            seen.append(_ask(client, "m@prod")[0])  # raises (failing the test) on any error

    with ThreadPoolExecutor(4) as pool:
        senders = [pool.submit(send) for _ in range(4)]
        for i in range(8):
            r = admin_call(kiln, "PUT", "/models/m/aliases/prod", json={"version": "21"[i % 2]})
            assert r.status_code == 200, r.text
            stop.wait(0.3)
        stop.set()
        for sender in senders:
            sender.result()
    assert set(seen) == {"1", "2"}, set(seen)
    assert len(seen) > 20
    assert _ask(client, "m@prod")[0] == "1"  # the last move: to 1
    listed = admin_call(kiln, "GET", "/models/m/aliases").json()
    assert listed == [{"model": "m", "alias": "prod", "version": "1"}]


def test_an_operator_pins_a_tenant(kiln: KilnProcess, client: openai.OpenAI) -> None:
    tenants = admin_call(kiln, "GET", "/tenants").json()
    ops = next(t["id"] for t in tenants if t["name"] == "ops")
    r = admin_call(kiln, "PUT", f"/models/m/pins/{ops}", json={"target": "prod"})  # prod -> 1
    assert r.status_code == 200, r.text
    assert _ask(client, "m")[0] == "1"  # pinned, though the newest is 2
    assert _ask(client, "m@2")[0] == "2"  # an explicit address still wins
    assert admin_call(kiln, "DELETE", f"/models/m/pins/{ops}").status_code == 204
    assert _ask(client, "m")[0] == "2"


def test_deprecated_then_retired(kiln: KilnProcess, client: openai.OpenAI) -> None:
    change = {"state": "deprecated", "sunset": "2027-01-01T00:00:00Z", "successor": "2"}
    r = admin_call(kiln, "PATCH", "/models/m/versions/1", json=change)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "deprecated"
    raw = client.embeddings.with_raw_response.create(model="m@1", input="hello")
    assert raw.headers[VERSION] == "1"
    assert raw.headers["sunset"] == "Fri, 01 Jan 2027 00:00:00 GMT"
    assert raw.headers["deprecation"].startswith("@")
    assert "m@2" in raw.headers["link"]

    r = admin_call(kiln, "PATCH", "/models/m/versions/1", json={"state": "retired"})
    assert r.status_code == 400, r.text  # the alias prod still names it
    assert '"state"' in r.text, r.text
    assert admin_call(kiln, "DELETE", "/models/m/aliases/prod").status_code == 204
    r = admin_call(kiln, "PATCH", "/models/m/versions/1", json={"state": "retired"})
    assert r.status_code == 200, r.text
    with pytest.raises(openai.APIStatusError) as gone:
        client.embeddings.create(model="m@1", input="hello")
    assert gone.value.status_code == 410
    assert "m@2" in gone.value.message

    r = admin_call(kiln, "PUT", "/models/m/route", json={"stable_version": "1"})
    assert r.status_code == 400, r.text
    assert '"stable_version"' in r.text, r.text
    r = admin_call(kiln, "PUT", "/models/m/aliases/prod", json={"version": "1"})
    assert r.status_code == 400, r.text
    assert '"version"' in r.text, r.text
    version = msgspec.json.decode(kiln.cli("models", "version", "m", "1"))
    assert (version["state"], version["successor"]) == ("retired", "2")
