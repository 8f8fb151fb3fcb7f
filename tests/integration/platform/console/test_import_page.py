"""Importing a model from the console's Models page: the upload answers with the build job's
panel, which polls itself until the version is ready and shows its accuracy report; the table's
row shows it too. Tenant-admins see no form and are refused the upload."""

from __future__ import annotations

import asyncio
import io
import re
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

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
        secret_key="console-test-secret", pool_initial_replicas=0,
    )  # fmt: skip


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory, tiny_models: Any) -> bytes:
    """A tiny BERT sentence-transformers folder, tarred as a user would."""
    folder = tiny_models.sentence(tmp_path_factory.mktemp("st") / "bert", "mean", normalize=True)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(Path(folder), arcname="bert")
    return buffer.getvalue()


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
        phases = []
        deadline = time.monotonic() + 300
        while (poll := _POLL.search(r.text)) is not None:
            phases.append(re.search(r'class="phase">([^<]*)<', r.text).group(1))  # type: ignore[union-attr]
            assert time.monotonic() < deadline, phases
            await asyncio.sleep(0.5)
            r = await http.get(poll.group(1), headers=HX)
            assert r.status_code == 200, r.text
        assert 'data-status="done"' in r.text, r.text
        assert phases[0] in ("received", "queued")
        assert 'class="version">1<' in r.text
        cosine = float(re.search(r'class="min-cosine">([0-9.]+)<', r.text).group(1))  # type: ignore[union-attr]
        assert cosine >= 0.9999
        assert 'id="models" hx-swap-oob="true"' in r.text  # the table gains the version
        page = await http.get("/console/models")
        row = page.text[page.text.index(f'id="model-{name}"') :]
        assert 'class="min-cosine"' in row[: row.index("</table>")]


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
