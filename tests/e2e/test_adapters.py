"""LoRA adapters end to end: a tenant-admin uploads PEFT files through ``/admin/v1``, then the
official ``openai`` SDK chats with ``<model>:<adapter>`` on a real ``kiln up`` worker."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from playwright.sync_api import Page, expect
from sqlalchemy import func, select

from kiln_platform.db.database import open_database
from kiln_platform.db.tables import UsageEvent
from kiln_platform.settings import Settings
from kiln_runtimes.lora import Dims

from .conftest import PASSWORD, SMOLLM2, KilnProcess, serve_model, settled, sign_in

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from contextlib import AbstractContextManager

QV = ("q_proj", "v_proj")
ASK: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Name three colours of the rainbow."}
]


@pytest.fixture(scope="module")
def llm_up(
    smollm2_dir: Path,
    start_kiln: Callable[..., KilnProcess],
    kiln_data_dir: Callable[[], AbstractContextManager[Path]],
) -> Iterator[KilnProcess]:
    """``kiln up`` with SmolLM2 whose workers hold 4 adapters (adapter slots are opt-in)."""
    with kiln_data_dir() as path:
        kiln = start_kiln(path, [smollm2_dir], {"KILN_WORKER_ADAPTER_SLOTS": "4"})
        yield from serve_model(kiln, SMOLLM2, "completions")


@pytest.fixture(scope="module")
def admin(llm_up: KilnProcess) -> httpx.Client:
    """A tenant-admin key of the test tenant, for ``/admin/v1``."""
    out = llm_up.cli("keys", "create", "--tenant", "acme", "--role", "tenant-admin",
                     "--scope", "admin:write", "--scope", "inference")  # fmt: skip
    key = out.strip().splitlines()[-1]
    return httpx.Client(base_url=llm_up.base_url, headers={"authorization": f"Bearer {key}"})


def _upload(admin: httpx.Client, tenant: str, name: str, folder: Path) -> httpx.Response:
    files = {
        part: (name, (folder / name).read_bytes())
        for part, name in (
            ("config", "adapter_config.json"),
            ("weights", "adapter_model.safetensors"),
        )
    }
    data = {"name": name, "model": SMOLLM2}
    return admin.post(f"/admin/v1/tenants/{tenant}/adapters", data=data, files=files, timeout=60)


def _adapters_billed(kiln: KilnProcess) -> dict[str | None, int]:
    """Successful chat completions in the ledger, by the adapter each named."""

    async def read() -> dict[str | None, int]:
        async with (
            open_database(Settings(data_dir=Path(kiln.env["KILN_DATA_DIR"]))) as db,
            db.sessions() as session,
        ):
            rows = await session.execute(
                select(UsageEvent.adapter, func.count())
                .where(UsageEvent.endpoint == "chat.completions", UsageEvent.status == 200)
                .group_by(UsageEvent.adapter)
            )
            return {adapter: count for adapter, count in rows}

    return asyncio.run(read())


def _chat(client: openai.OpenAI, model: str) -> Any:
    return client.chat.completions.create(model=model, messages=ASK, temperature=0, max_tokens=24)


def test_a_tenant_uploads_an_adapter_and_chats_with_it(
    llm_up: KilnProcess, admin: httpx.Client, smollm2_dir: Path, peft: Any, tmp_path: Path
) -> None:
    tenant = admin.get("/admin/v1/tenants").raise_for_status().json()[0]["id"]
    dims = Dims.from_genai_config(json.loads((smollm2_dir / "genai_config.json").read_text()))
    made = {
        "zero": peft.tensors(dims, 8, QV, seed=1, zero_b=True),
        "tuned": peft.tensors(dims, 8, QV, seed=2),
    }
    client = openai.OpenAI(base_url=f"{llm_up.base_url}/v1", api_key=llm_up.key, max_retries=0)
    with pytest.raises(openai.NotFoundError):  # the gateway now caches this miss for 5 s ...
        _chat(client, f"{SMOLLM2}:tuned")
    for name, weights in made.items():
        folder = peft.write(tmp_path / name, peft.config(8, QV), weights)
        created = _upload(admin, tenant, name, folder)
        assert created.status_code == 201, created.text
        assert created.json()["model"] == f"{SMOLLM2}:{name}"
    wrong = Dims(num_layers=dims.num_layers, hidden=64, q_size=dims.q_size, kv_size=dims.kv_size)
    bad = peft.write(tmp_path / "bad", peft.config(8, QV), peft.tensors(wrong, 8, QV, seed=3))
    refused = _upload(admin, tenant, "bad", bad)
    assert refused.status_code == 400
    assert "this model needs" in refused.json()["detail"]
    assert refused.json()["param"] == "weights"
    listed = admin.get(f"/admin/v1/tenants/{tenant}/adapters").raise_for_status().json()
    assert [a["name"] for a in listed] == ["tuned", "zero"]  # nothing of the refused one

    base = _chat(client, SMOLLM2).choices[0].message.content
    assert _chat(client, f"{SMOLLM2}:zero").choices[0].message.content == base
    tuned = _chat(client, f"{SMOLLM2}:tuned")  # ... which the upload made it forget
    assert tuned.model == f"{SMOLLM2}:tuned"
    assert tuned.choices[0].message.content != base
    assert (
        _chat(client, f"{SMOLLM2}:tuned").choices[0].message.content
        == tuned.choices[0].message.content
    )
    assert _adapters_billed(llm_up) == {None: 1, "zero": 1, "tuned": 2}  # priced as the base
    cards = {m.id: m for m in client.models.list().data}
    extra = cards[f"{SMOLLM2}:tuned"].model_extra
    assert extra is not None
    assert extra["parent"] == SMOLLM2
    assert extra["max_model_len"] == cards[SMOLLM2].model_extra["max_model_len"] == 8192  # type: ignore[index]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        _chat(client, f"{SMOLLM2}:nope")

    llm_up.cli("tenants", "create", "globex")
    stranger_key = llm_up.cli("keys", "create", "--tenant", "globex").strip().splitlines()[-1]
    stranger = openai.OpenAI(base_url=f"{llm_up.base_url}/v1", api_key=stranger_key, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        _chat(stranger, f"{SMOLLM2}:tuned")  # adapters are the tenant's own

    tuned_id = next(a["id"] for a in listed if a["name"] == "tuned")
    admin.delete(f"/admin/v1/tenants/{tenant}/adapters/{tuned_id}").raise_for_status()
    with pytest.raises(openai.NotFoundError):  # at once on this gateway (others: within 5 s)
        _chat(client, f"{SMOLLM2}:tuned")


@pytest.fixture(scope="module")
def kiln(llm_up: KilnProcess) -> KilnProcess:
    """The ``kiln up`` the console's browser tests open (``page``)."""
    llm_up.cli("users", "create", "--email", "lora@acme.test", "--role", "tenant-admin",
               "--tenant", "acme", "--password", PASSWORD)  # fmt: skip
    return llm_up


def test_a_tenant_admin_uploads_an_adapter_in_the_console(
    page: Page, smollm2_dir: Path, peft: Any, tmp_path: Path
) -> None:
    dims = Dims.from_genai_config(json.loads((smollm2_dir / "genai_config.json").read_text()))
    folder = peft.write(tmp_path / "web", peft.config(4, QV), peft.tensors(dims, 4, QV, seed=5))
    sign_in(page, "lora@acme.test")
    page.click("header nav >> text=Adapters")
    page.fill("#new-adapter input[name=name]", "from-the-web")
    page.set_input_files("#new-adapter input[name=config]", folder / "adapter_config.json")
    page.set_input_files("#new-adapter input[name=weights]", folder / "adapter_model.safetensors")
    page.click("#new-adapter button[type=submit]")
    row = page.locator("#adapters tbody tr[data-name='from-the-web']")
    expect(row.locator("code")).to_have_text(f"{SMOLLM2}:from-the-web")
    settled(page)  # the new row's button is live
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Delete").click()
    expect(row).to_have_count(0)
