"""The overview in a real browser: a tenant-admin lands on it, reads today's usage, makes a key,
calls the API with it (``openai``), and sees the request in the numbers and the chart within
the panel's 5 s polling interval, without reloading. Full-page screenshots go under ``tmp_path``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from playwright.sync_api import Page, expect

from .conftest import MINILM, PASSWORD, KilnProcess, minilm_up, sign_in

POLL_S = 5.0


@pytest.fixture(scope="module")
def kiln(minilm_dir: Path) -> Iterator[KilnProcess]:
    """``kiln up`` serving all-MiniLM-L6-v2, tenant ``acme`` with a tenant-admin."""
    for kiln in minilm_up(minilm_dir, {}):
        kiln.cli("users", "create", "--email", "admin@acme.test", "--role", "tenant-admin",
                 "--tenant", "acme", "--password", PASSWORD)  # fmt: skip
        yield kiln


def _bars_total(page: Page) -> int:
    """The requests chart's bars, summed from their values."""
    values = page.locator("#chart-requests rect.bar").evaluate_all(
        "bars => bars.map(b => Number(b.dataset.value))"
    )
    return int(sum(values))


def test_a_tenant_admin_sees_a_new_request_in_the_overview(
    kiln: KilnProcess, page: Page, tmp_path: Path
) -> None:  # kiln first: it registers the model with asyncio.run, before Playwright's loop
    sign_in(page, "admin@acme.test")
    expect(page).to_have_url(re.compile(r"/console/overview$"))
    expect(page.locator("h1")).to_contain_text("acme")
    before = int(page.locator("#stat-requests").inner_text().replace(",", ""))
    assert _bars_total(page) == before
    expect(page.locator("#chart-requests rect.bar")).to_have_count(24)  # today, per hour
    page.screenshot(path=tmp_path / "1-overview.png", full_page=True)

    page.click("header nav >> text=API keys")
    page.fill("#new-key input[name=name]", "overview")
    page.click("#new-key button[type=submit]")
    secret = page.locator("#secret-value").input_value()
    page.screenshot(path=tmp_path / "2-key.png", full_page=True)
    page.click("header nav >> text=Overview")
    shown = int(page.locator("#stat-requests").inner_text().replace(",", ""))

    sdk = openai.OpenAI(api_key=secret, base_url=f"{kiln.base_url}/v1", max_retries=0)
    sdk.embeddings.create(model=MINILM, input=["the overview counts this"])
    # No reload: the panel's next poll (every 5 s) brings it.
    requests = page.locator("#stat-requests")
    expect(requests).to_have_text(str(shown + 1), timeout=(POLL_S + 5) * 1000)
    assert _bars_total(page) == shown + 1
    assert int(page.locator("#stat-tokens").inner_text().replace(",", "")) > 0
    bars = page.locator("#chart-requests rect.bar title")
    expect(bars.filter(has_text=re.compile(r"UTC"))).to_have_count(24)
    page.screenshot(path=tmp_path / "3-after.png", full_page=True)
