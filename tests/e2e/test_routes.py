"""Model routes end to end: two versions of an uploaded tensor model, a 50 % canary that each
tenant sees consistently through ``tritonclient``, a pinned version in the URL, and a rollback
that retires the canary's workers."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from playwright.sync_api import Page, expect
from tritonclient.utils import InferenceServerException

from .conftest import PASSWORD, KilnProcess, admin_call, sign_in, use_platform_admin_key, wait_for

TENANTS = 20


@pytest.fixture(scope="module")
def kiln(
    start_kiln: Callable[..., KilnProcess],
    kiln_data_dir: Callable[[], AbstractContextManager[Path]],
    tensor_models: dict[str, Path],
) -> Iterator[KilnProcess]:
    """``kiln up`` with ``mlp`` uploaded as versions 1 and 2, and a platform-admin key."""
    with kiln_data_dir() as path:
        kiln = start_kiln(path, [])
        try:
            use_platform_admin_key(kiln)
            kiln.cli("users", "create", "--email", "ops@kiln.test", "--role", "platform-admin",
                     "--password", PASSWORD)  # fmt: skip
            body = tensor_models["mlp"].read_bytes()
            for version in ("1", "2"):
                r = admin_call(kiln, "POST", "/models/mlp/versions", content=body,
                           params={"version": version})  # fmt: skip
                assert r.status_code == 201, r.text
            yield kiln
        finally:
            if kiln.proc.poll() is None:
                kiln.stop()


@pytest.fixture(scope="module")
def keys(kiln: KilnProcess) -> list[str]:
    """One inference key in each of ``TENANTS`` tenants, made through the admin API."""
    out = []
    for _ in range(TENANTS):
        r = admin_call(kiln, "POST", "/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}"})
        tenant = r.json()["id"]
        r = admin_call(kiln, "POST", f"/tenants/{tenant}/keys", json={"scopes": ["inference"]})
        out.append(r.json()["secret"])
    return out


def _version(kiln: KilnProcess, key: str, pinned: str = "", name: str = "mlp") -> str:
    client = triton.InferenceServerClient(kiln.base_url.removeprefix("http://"))
    x = triton.InferInput("x", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    scale = triton.InferInput("scale", [1, 1], "FP32")
    scale.set_data_from_numpy(np.ones((1, 1), np.float32))
    headers = {"authorization": f"Bearer {key}"}
    result = client.infer(name, [x, scale], model_version=pinned, headers=headers)
    return str(result.get_response()["model_version"])


def _mlp_workers(kiln: KilnProcess) -> list[str]:
    return [" ".join(p.cmdline()) for p in kiln.workers() if "--standby" not in p.cmdline()]


def test_without_a_route_the_newest_version_serves(kiln: KilnProcess, keys: list[str]) -> None:
    assert {_version(kiln, key) for key in keys[:3]} == {"2"}
    lineage = admin_call(kiln, "GET", "/models/mlp/versions/1").json()
    assert (lineage["state"], lineage["imported_by"][:4]) == ("active", "key:")


def test_a_canary_serves_its_share_each_tenant_sticking_to_one_version(
    kiln: KilnProcess, keys: list[str]
) -> None:
    route = {"stable_version": "1", "canary_version": "2", "canary_percent": 50}
    r = admin_call(kiln, "PUT", "/models/mlp/route", json=route)
    assert r.status_code == 200, r.text
    seen = [{_version(kiln, key) for _ in range(2)} for key in keys]
    assert all(len(versions) == 1 for versions in seen)  # sticky per tenant
    assert set().union(*seen) == {"1", "2"}  # both versions serve
    assert _version(kiln, keys[0], pinned="2") == "2"
    assert _version(kiln, keys[0], pinned="1") == "1"
    with pytest.raises(InferenceServerException, match="does not exist"):
        _version(kiln, keys[0], pinned="7")
    assert admin_call(kiln, "PUT", "/models/mlp/aliases/prod", json={"version": "2"}).is_success
    assert _version(kiln, keys[0], name="mlp@prod") == "2"  # an alias in the OIP name
    assert _version(kiln, keys[0], name="mlp@canary") == "2"
    assert admin_call(kiln, "DELETE", "/models/mlp/aliases/prod").status_code == 204


def test_rollback_sends_everyone_to_stable_and_retires_the_canary(
    kiln: KilnProcess, keys: list[str]
) -> None:
    out = kiln.cli("models", "route", "mlp", "--stable", "1")  # another process: the CLI
    assert out.strip() == "mlp: stable=1"
    wait_for(lambda: {_version(kiln, key) for key in keys} == {"1"}, 30)  # the 2 s refresh
    wait_for(lambda: len(_mlp_workers(kiln)) == 1, 60)  # version 2's worker drained and left
    (worker,) = _mlp_workers(kiln)
    assert "--version 1" in worker


def test_an_operator_routes_a_canary_in_the_console(kiln: KilnProcess, page: Page) -> None:
    sign_in(page, "ops@kiln.test")
    page.click("header nav >> text=Models")
    card = page.locator("#model-mlp")
    card.locator("select[name=canary_version]").select_option("2")
    card.locator("input[name=canary_percent]").fill("25")
    card.get_by_role("button", name="Route").click()
    card = page.locator("#model-mlp")  # the section was swapped
    expect(card.locator("tr[data-version='2'] .serves")).to_have_text("canary (25 %)")
    route = admin_call(kiln, "GET", "/models/mlp/route").json()
    assert (route["canary_version"], route["canary_percent"]) == ("2", 25)
    row = card.locator("tr[data-version='2']")

    def canary_worker_ready() -> bool:
        page.reload()
        return (row.locator(".ready").inner_text(), row.locator(".desired").inner_text()) == (
            "1",
            "1",
        )

    wait_for(canary_worker_ready, 60)
