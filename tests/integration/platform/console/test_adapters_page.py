"""The console's adapters page: a tenant-admin uploads PEFT's two files (a file that does not fit
the model is named in the flash, nothing kept), sees the name to call, deletes; a member reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from safetensors.numpy import save_file

from kiln_platform.settings import Settings
from kiln_runtimes.lora import Dims

from ..conftest import TINY_LLM_DIMS as DIMS
from ..conftest import register_tiny_llm
from .conftest import App

HX = {"hx-request": "true"}
QV = ("q_proj", "v_proj")


@pytest.fixture(scope="module")
def settings(database_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """No worker starts (the registered model has no real graph)."""
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("console-test-secret"), key_cache_ttl_s=0.0, pool_initial_replicas=0,
        worker_adapter_slots=2,
    )  # fmt: skip


@pytest.fixture(scope="module")
async def model(app: App, tmp_path_factory: pytest.TempPathFactory) -> str:
    return await register_tiny_llm(app.kiln, tmp_path_factory.mktemp("tiny-llm"))


def _files(peft: Any, tmp_path: Path, dims: Dims = DIMS) -> dict[str, tuple[str, bytes]]:
    save_file(peft.tensors(dims, 4, QV, seed=1), str(tmp_path / "w.safetensors"))
    return {
        "config": ("adapter_config.json", json.dumps(peft.config(4, QV)).encode()),
        "weights": ("adapter_model.safetensors", (tmp_path / "w.safetensors").read_bytes()),
    }


async def test_a_tenant_admin_uploads_and_deletes_an_adapter(
    app: App, model: str, peft: Any, tmp_path: Path
) -> None:
    tenant = await app.tenant()
    async with app.signed_in(await app.user("tenant-admin", tenant)) as (http, token):
        headers = {**HX, "x-csrftoken": token}
        base = f"/console/tenants/{tenant}/adapters"
        page = await http.get(base)
        assert page.status_code == 200
        assert 'id="new-adapter"' in page.text
        assert f"<option>{model}</option>" in page.text
        wide = Dims(num_layers=2, hidden=16, q_size=8, kv_size=4)
        r = await http.post(base, data={"name": "bot", "model": model},
                            files=_files(peft, tmp_path, wide), headers=headers)  # fmt: skip
        assert r.status_code == 400
        assert 'data-field="weights"' in r.text
        r = await http.post(base, data={"name": "bot", "model": model}, headers=headers)
        assert r.status_code == 400  # no files chosen
        assert 'data-field="weights"' in r.text
        assert "No adapters yet." in (await http.get(base)).text
        r = await http.post(base, data={"name": "bot", "model": model},
                            files=_files(peft, tmp_path), headers=headers)  # fmt: skip
        assert r.status_code == 201, r.text
        assert f"<code>{model}:bot</code>" in r.text
        adapter = r.text.split('id="adapter-')[1].split('"')[0]
        r = await http.post(f"{base}/{adapter}/delete", headers=headers)
        assert r.status_code == 200
        assert "No adapters yet." in r.text


async def test_a_member_reads_adapters_without_forms(
    app: App, model: str, peft: Any, tmp_path: Path
) -> None:
    tenant = await app.tenant()
    base = f"/console/tenants/{tenant}/adapters"
    async with app.signed_in(await app.user("tenant-admin", tenant)) as (http, token):
        headers = {**HX, "x-csrftoken": token}
        form = {"name": "x", "model": model}
        r = await http.post(base, data=form, files=_files(peft, tmp_path), headers=headers)
        assert r.status_code == 201
    async with app.signed_in(await app.user("tenant-member", tenant)) as (http, token):
        page = await http.get(base)
        assert f"<code>{model}:x</code>" in page.text
        assert 'id="new-adapter"' not in page.text
        assert "Delete" not in page.text
        headers = {**HX, "x-csrftoken": token}
        form = {"name": "y", "model": model}
        r = await http.post(base, data=form, files=_files(peft, tmp_path), headers=headers)
        assert r.status_code == 403
