"""Importing a model from the console's Models page: the upload answers with the build job's
panel, which polls itself until the version is ready and shows its accuracy report; the table's
row shows it too. Tenant-admins see no form and are refused the upload."""

from __future__ import annotations

import asyncio
import io
import re
import shutil
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from kiln_platform.settings import Settings

from .conftest import App

pytestmark = pytest.mark.slow
HX = {"hx-request": "true"}
_POLL = re.compile(r'hx-get="(/console/compile-jobs/[0-9a-f-]+)" hx-trigger="every 1s"')


@pytest.fixture(scope="module")
def settings(database_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """No worker starts for the imported version (the test reads the page, not the model)."""
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("console-test-secret"), pool_initial_replicas=0,
    )  # fmt: skip


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory, tiny_models: Any) -> Path:
    """A tiny BERT sentence-transformers folder."""
    folder = tiny_models.sentence(tmp_path_factory.mktemp("st") / "bert", "mean", normalize=True)
    return Path(folder)


@pytest.fixture(scope="module")
def archive(bert: Path) -> bytes:
    return _tar(bert)


def _tar(folder: Path) -> bytes:
    """``folder`` tarred as a user would."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(folder, arcname="bert")
    return buffer.getvalue()


async def _follow(http: httpx.AsyncClient, r: httpx.Response) -> tuple[str, list[str]]:
    """Poll the job panel as htmx would until it stops polling; its last text and the phases."""
    phases: list[str] = []
    deadline = time.monotonic() + 300
    while (poll := _POLL.search(r.text)) is not None:
        phases.append(re.search(r'class="phase">([^<]*)<', r.text).group(1))  # type: ignore[union-attr]
        assert time.monotonic() < deadline, phases
        await asyncio.sleep(0.5)
        r = await http.get(poll.group(1), headers=HX)
        assert r.status_code == 200, r.text
    return r.text, phases


async def test_a_platform_admin_imports_and_follows_the_build(app: App, archive: bytes) -> None:
    name = f"bert-{uuid.uuid4().hex[:6]}"
    async with app.signed_in(await app.user("platform-admin")) as (http, token):
        page = await http.get("/console/models")
        assert 'id="import-model"' in page.text
        assert "htmx:xhr:progress" in page.text
        form = {"name": name, "task": "auto", "precision": "fp32", "target": "cpu", "version": ""}
        files = {"file": ("bert.tar", archive, "application/x-tar")}
        headers = {**HX, "x-csrftoken": token}
        r = await http.post("/console/models/import", data=form, files=files, headers=headers)
        assert r.status_code == 202, r.text
        text, phases = await _follow(http, r)
        print("phases", phases)
        assert 'data-status="done"' in text, text
        assert phases[0] in ("received", "queued")
        assert 'class="version">1<' in text
        cosine = float(re.search(r'class="min-cosine">([0-9.]+)<', text).group(1))  # type: ignore[union-attr]
        assert cosine >= 0.9999
        assert 'id="models" hx-swap-oob="true"' in text  # the table gains the version
        page = await http.get("/console/models")
        row = page.text[page.text.index(f'id="model-{name}"') :]
        assert 'class="min-cosine"' in row[: row.index("</details>")]


async def test_a_failed_build_names_the_file(app: App, bert: Path, tmp_path: Path) -> None:
    broken = tmp_path / "bert"
    shutil.copytree(bert, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    async with app.signed_in(await app.user("platform-admin")) as (http, token):
        form = {"name": f"broken-{uuid.uuid4().hex[:6]}", "precision": "fp32"}
        files = {"file": ("bert.tar", _tar(broken), "application/x-tar")}
        r = await http.post("/console/models/import", data=form, files=files,
                            headers={**HX, "x-csrftoken": token})  # fmt: skip
        assert r.status_code == 202, r.text
        text, _ = await _follow(http, r)
        print(text)
        assert 'data-status="failed"' in text, text
        assert '<code class="error-file">model.safetensors</code>' in text
        assert 'class="error-field"' in text


async def test_scoring_prompts_is_refused_for_an_embeddings_model(app: App, archive: bytes) -> None:
    async with app.signed_in(await app.user("platform-admin")) as (http, token):
        page = await http.get("/console/models")
        assert 'name="score_prompts"' in page.text
        form = {"name": f"bert-{uuid.uuid4().hex[:6]}", "score_prompts": "true"}
        files = {"file": ("bert.tar", archive, "application/x-tar")}
        r = await http.post("/console/models/import", data=form, files=files,
                            headers={**HX, "x-csrftoken": token})  # fmt: skip
        assert r.status_code == 400
        assert "score_prompts" in r.text


async def test_a_tenant_admin_sees_no_form_and_is_refused(app: App, archive: bytes) -> None:
    tenant = await app.tenant()
    async with app.signed_in(await app.user("tenant-admin", tenant)) as (http, token):
        page = await http.get("/console/models")
        assert page.status_code == 200
        assert 'id="import-model"' not in page.text
        r = await http.post("/console/models/import", data={"name": "nope"},
                            headers={**HX, "x-csrftoken": token},
                            files={"file": ("bert.tar", archive, "application/x-tar")})  # fmt: skip
        assert r.status_code == 403
