"""Models for operators in a real browser against a real ``kiln up``: a platform-admin imports a
tiny BERT folder and watches its build job reach ready, then raises the version's minimum
replicas from the page and watches the live table (desired / starting / ready / draining,
polled by htmx, no reload) and the worker processes follow."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import openai
import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect

from .conftest import PASSWORD, KilnProcess, settled, sign_in, wait_for

OPS = "ops@kiln.test"
DataDir = AbstractContextManager[Path]


@pytest.fixture(scope="module")
def kiln(
    start_kiln: Callable[..., KilnProcess], kiln_data_dir: Callable[[], DataDir]
) -> Iterator[KilnProcess]:
    """``kiln up`` with no models, a tenant and a platform-admin."""
    with kiln_data_dir() as path:
        kiln = start_kiln(path, [])
        try:
            kiln.cli("tenants", "create", "acme")
            kiln.cli("users", "create", "--email", OPS, "--role", "platform-admin",
                     "--password", PASSWORD)  # fmt: skip
            yield kiln
        finally:
            if kiln.proc.poll() is None:
                kiln.stop()


def _import(page: Page, name: str, archive: Path) -> list[str]:
    """Import ``archive`` from the page's form; the build phases seen until the job ended."""
    form = page.locator("#import-model")
    form.locator("input[name=name]").fill(name)
    form.locator("input[name=file]").set_input_files(archive)
    form.locator("select[name=precision]").select_option("fp32")
    form.locator("button[type=submit]").click()
    panel, phases = page.locator("#import-job"), list[str]()
    deadline = time.monotonic() + 300
    while panel.get_attribute("data-status") in (None, "queued", "running"):
        assert time.monotonic() < deadline, phases
        phase = panel.locator(".phase")
        if phase.count() and (text := phase.inner_text()) and phases[-1:] != [text]:
            phases.append(text)
        page.wait_for_timeout(100)
    expect(panel).to_have_attribute("data-status", "done")
    return phases


_COUNTS = ("desired", "starting", "ready", "draining")


def _replicas(page: Page, version: str) -> tuple[str, ...]:
    """A version's replica counts as the live table shows them: desired, starting, ready,
    draining."""
    row = page.locator(f"#pools-tiny-bert tr[data-version='{version}']")
    return tuple(row.locator(f".{name}").inner_text() for name in _COUNTS)


def _watch(page: Page, until: tuple[str, ...], seconds: float) -> list[tuple[str, ...]]:
    """The distinct replica counts version 1's row went through until it showed ``until``."""
    seen: list[tuple[str, ...]] = []
    deadline = time.monotonic() + seconds
    while not seen or seen[-1] != until:
        assert time.monotonic() < deadline, seen
        with contextlib.suppress(PlaywrightError):  # the row is being swapped
            if (counts := _replicas(page, "1")) and seen[-1:] != [counts]:
                seen.append(counts)
        page.wait_for_timeout(100)
    return seen


def _workers(kiln: KilnProcess, model: str) -> int:
    return sum(1 for p in kiln.workers() if f"--model {model}" in " ".join(p.cmdline()))


def test_a_platform_admin_imports_a_model_and_scales_its_pool(
    kiln: KilnProcess, page: Page, bert_tar: Path, tmp_path: Path
) -> None:
    sign_in(page, OPS)
    page.click("header nav >> text=Models")
    settled(page)
    phases = _import(page, "tiny-bert", bert_tar)
    assert len(phases) > 1, phases  # the job's phases went by live
    row = page.locator("#pools-tiny-bert tr[data-version='1']")
    expect(row).to_have_attribute("data-state", "serving")
    expect(row.locator(".ready")).to_have_text("1", timeout=60_000)  # the live table polls
    expect(row.locator(".desired")).to_have_text("1")
    page.screenshot(path=tmp_path / "models-imported.png", full_page=True)

    client = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.new_key("acme"))
    client.embeddings.create(model="tiny-bert", input="hello")
    expect(row.locator(".p50")).to_contain_text("ms")  # the gateway's own histogram

    card = page.locator("#model-tiny-bert")
    card.locator("details[data-version='1'] summary").click()
    engine = card.locator("details[data-version='1'] form.engine")
    engine.locator("input[name=min_replicas]").fill("3")
    engine.locator("input[name=max_replicas]").fill("2")
    engine.get_by_role("button", name="Save").click()
    expect(page.locator("#flash .error")).to_have_attribute("data-field", "min_replicas")
    engine.locator("input[name=max_replicas]").fill("")
    engine.locator("input[name=min_replicas]").fill("2")
    page.evaluate("window.notReloaded = true")  # gone if anything reloads the page
    engine.get_by_role("button", name="Save").click()
    settled(page)
    expect(page.locator("#flash .error")).to_have_count(0)
    seen = _watch(page, ("2", "0", "2", "0"), 60)  # desired, starting, ready, draining
    # one ready replica when the new bounds were saved, then two (a tiny model's replica may
    # start between two polls: the starting count is not always seen)
    assert seen[0][2] == "1", seen
    assert page.evaluate("window.notReloaded") is True  # htmx polling, no reload
    assert wait_for(lambda: _workers(kiln, "tiny-bert") == 2 or None, 10)
    page.screenshot(path=tmp_path / "models-scaled.png", full_page=True)
    print("screenshots in", tmp_path, "build phases", phases, "replicas seen", seen)
