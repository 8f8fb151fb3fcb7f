"""``/admin/v1/tenants/{id}/adapters``: upload checked against the base model with the 400 naming
the field (and nothing kept of a refused upload), roles and tenants, and ``/v1/models``."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from safetensors.numpy import save_file
from sqlalchemy import func, select

from kiln_platform.adapters.directory import slot_rank
from kiln_platform.adapters.services import Upload, create_adapter
from kiln_platform.db.tables import Adapter
from kiln_platform.errors import BadRequest
from kiln_platform.settings import Settings
from kiln_runtimes.lora import Dims
from tests.factories import CLI

from ..conftest import TINY_LLM_DIMS as DIMS
from ..conftest import register_tiny_llm
from .conftest import Admin

MODEL = "tiny-llm"
QV = ("q_proj", "v_proj")


@pytest.fixture(scope="module")
def settings(database_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Workers hold adapters; none starts (the registered model has no real graph)."""
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("adapters-test-secret"), key_cache_ttl_s=0.0, pool_initial_replicas=0,
        worker_adapter_slots=2, worker_adapter_rank=8,
    )  # fmt: skip


@pytest.fixture(scope="module")
async def model(admin: Admin, tmp_path_factory: pytest.TempPathFactory) -> str:
    return await register_tiny_llm(admin.kiln, tmp_path_factory.mktemp("tiny-llm"), MODEL)


def _files(peft: Any, tmp_path: Path, *, config: Any = None, weights: bytes | None = None,
           dims: Dims = DIMS, rank: int = 4) -> dict[str, tuple[str, bytes]]:  # fmt: skip
    settings = peft.config(rank, QV) if config is None else config
    save_file(peft.tensors(dims, rank, QV, seed=1), str(tmp_path / "w.safetensors"))
    body = (tmp_path / "w.safetensors").read_bytes() if weights is None else weights
    raw = settings if isinstance(settings, bytes) else json.dumps(settings).encode()
    return {"config": ("adapter_config.json", raw), "weights": ("adapter_model.safetensors", body)}


async def _count(admin: Admin) -> int:
    async with admin.kiln.db.sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(Adapter)) or 0)


@pytest.mark.parametrize(
    ("form", "files", "param", "words"),
    [
        ({"name": "Bad Name"}, {}, "name", "adapter name"),
        ({"model": "nope"}, {}, "model", "no generation model"),
        ({}, {"config": b"{not json"}, "config", "not JSON"),
        ({}, {"config": {"peft_type": "LORA", "r": 8, "target_modules": QV}}, "config", "needs 16"),
        ({}, {"weights": b"not safetensors"}, "weights", "not a safetensors"),
        ({}, {"dims": Dims(num_layers=2, hidden=16, q_size=8, kv_size=4)}, "weights", "needs"),
    ],
)
async def test_an_upload_that_does_not_fit_is_refused_naming_the_field(
    admin: Admin, root: str, model: str, *, peft: Any, tmp_path: Path,
    form: dict[str, str], files: dict[str, Any], param: str, words: str,
) -> None:  # fmt: skip
    tenant = await admin.tenant(root, f"t-{uuid.uuid4()}")
    before = await _count(admin)
    body = _files(peft, tmp_path, **files)
    r = await admin.call("POST", f"/admin/v1/tenants/{tenant}/adapters", root,
                         data={"name": "ok", "model": model, **form}, files=body)  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json()["param"] == param
    assert words in r.json()["detail"]
    assert await _count(admin) == before


async def test_tenant_admins_upload_members_read_other_tenants_see_nothing(
    admin: Admin, root: str, model: str, peft: Any, tmp_path: Path
) -> None:
    tenant, other = await admin.tenant(root, "owner"), await admin.tenant(root, "other")
    owner = await admin.key(root, tenant, name="a", scopes=["admin:write", "inference"],
                            role="tenant-admin")  # fmt: skip
    member = await admin.key(root, tenant, name="m", scopes=["admin:read", "inference"],
                             role="tenant-member")  # fmt: skip
    stranger = await admin.key(root, other, name="s", scopes=["admin:write", "inference"],
                               role="tenant-admin")  # fmt: skip
    path = f"/admin/v1/tenants/{tenant}/adapters"
    form = {"name": "support", "model": model}
    r = await admin.call("POST", path, owner, data=form, files=_files(peft, tmp_path))
    assert r.status_code == 201, r.text
    made = r.json()
    assert (made["model"], made["rank"], made["modules"]) == (f"{model}:support", 4, list(QV))
    again = await admin.call("POST", path, owner, data=form, files=_files(peft, tmp_path))
    assert again.status_code == 409
    denied = await admin.call("POST", path, member, data={**form, "name": "x"},
                              files=_files(peft, tmp_path))  # fmt: skip
    assert denied.status_code == 403
    assert [a["name"] for a in (await admin.call("GET", path, member)).json()] == ["support"]
    assert (await admin.call("GET", path, stranger)).status_code == 404

    cards = (await admin.call("GET", "/v1/models", member)).json()["data"]
    assert {"id": f"{model}:support", "parent": model} in [
        {"id": c["id"], "parent": c.get("parent")} for c in cards
    ]
    theirs = (await admin.call("GET", "/v1/models", stranger)).json()["data"]
    assert all(":" not in c["id"] for c in theirs)
    card = await admin.call("GET", f"/v1/models/{model}:support", member)
    assert card.json()["parent"] == model

    assert (await admin.call("DELETE", f"{path}/{made['id']}", stranger)).status_code == 404
    assert (await admin.call("DELETE", f"{path}/{made['id']}", owner)).status_code == 204
    gone = await admin.call("GET", f"/v1/models/{model}:support", member)
    assert gone.status_code == 404


async def test_without_adapter_slots_an_upload_is_refused(
    admin: Admin, root: str, model: str, *, peft: Any, tmp_path: Path, settings: Settings
) -> None:
    assert slot_rank(settings) == 8
    assert slot_rank(settings.model_copy(update={"worker_adapter_slots": 0})) == 0
    tenant = uuid.UUID(await admin.tenant(root, f"t-{uuid.uuid4()}"))
    files = _files(peft, tmp_path)
    weights = tmp_path / "weights"
    weights.write_bytes(files["weights"][1])
    upload = Upload(name="x", model=model, config=files["config"][1], weights=weights)
    before = await _count(admin)
    async with admin.kiln.db.sessions.begin() as session:
        with pytest.raises(BadRequest, match="no adapter slots") as caught:
            await create_adapter(session, CLI, tenant, upload, store=admin.kiln.store, max_rank=0)
    assert caught.value.param == "model"
    assert await _count(admin) == before
