"""Keys in a real browser against a real ``kiln up`` serving all-MiniLM-L6-v2: usage per key as
a sparkline, rotation with an overlap (the old key answers the ``openai`` SDK until it ends; with
0 it is refused), keyboard-only key creation, and axe-core over every page each role can open."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest
from playwright.sync_api import Locator, Page, expect

from .conftest import MINILM, PASSWORD, KilnProcess, axe_violations, minilm_up, settled, sign_in

ADMIN, OPS = "admin@acme.test", "ops@kiln.test"
MEMBER, FINANCE = "dev@acme.test", "money@kiln.test"
USERS = {
    ADMIN: ("tenant-admin", ["--tenant", "acme"]),
    MEMBER: ("tenant-member", ["--tenant", "acme"]),
    OPS: ("platform-admin", []),
    FINANCE: ("finance", []),
}
_LINKS = """() => [...document.querySelectorAll("a[href^='/console/']")]
  .map(a => a.getAttribute("href"))"""


@pytest.fixture(scope="module")
def kiln(minilm_dir: Path) -> Iterator[KilnProcess]:
    """``kiln up`` serving all-MiniLM-L6-v2, tenant ``acme`` with an admin and a member, a
    platform-admin and a finance user."""
    for kiln in minilm_up(minilm_dir, {}):
        for email, (role, where) in USERS.items():
            kiln.cli("users", "create", "--email", email, "--role", role, *where,
                     "--password", PASSWORD)  # fmt: skip
        yield kiln


def _sdk(kiln: KilnProcess, secret: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=secret, base_url=f"{kiln.base_url}/v1", max_retries=0)


def _embed(sdk: openai.OpenAI) -> int:
    return len(sdk.embeddings.create(model=MINILM, input="rotate me").data)


def _row(page: Page, secret: str) -> Locator:
    """The keys table's row of a key (by its displayed prefix, ``kiln_<id>``)."""
    return page.locator(f"#keys tbody tr[data-prefix='{secret[:13]}']")


def _rotate(page: Page, secret: str, overlap: str) -> str:
    """Rotate a key in the console with an overlap in seconds; returns the new secret."""
    _row(page, secret).locator("select[name=overlap_s]").select_option(overlap)
    _row(page, secret).get_by_role("button", name=re.compile("^Rotate")).click()
    expect(page.locator("#secret-value")).not_to_have_value(re.compile(re.escape(secret)))
    settled(page)
    return page.locator("#secret-value").input_value()


def _keys_page(page: Page) -> None:
    """Sign in as the tenant-admin (who lands on the overview) and open the API keys page."""
    sign_in(page, ADMIN)
    page.get_by_role("link", name="API keys").click()
    page.wait_for_url(re.compile(r"/keys$"))


def test_rotation_keeps_the_old_key_for_the_overlap(kiln: KilnProcess, page: Page) -> None:
    _keys_page(page)
    page.fill("#new-key input[name=name]", "rotating")
    page.click("#new-key button[type=submit]")
    first = page.locator("#secret-value").input_value()
    for _ in range(3):
        assert _embed(_sdk(kiln, first)) == 1
    page.reload()
    row = _row(page, first)
    expect(row.locator(".spark-total")).to_have_text("3")
    expect(row.locator(".spark svg title")).to_contain_text("3 requests in 7 days")
    expect(row.locator(".last-used")).not_to_have_text("never")

    second = _rotate(page, first, "86400")  # 24 hours
    expect(row.locator(".status")).to_have_text("expiring")
    assert _embed(_sdk(kiln, first)) == 1  # the old key still answers during the overlap
    assert _embed(_sdk(kiln, second)) == 1

    expect(_row(page, second).locator(".status")).to_have_text("active")
    third = _rotate(page, second, "0")  # refuse now
    expect(_row(page, second).locator(".status")).to_have_text("expired")
    expect(page.locator("#new-secret")).to_contain_text("is refused from now on")
    with pytest.raises(openai.AuthenticationError):  # at once: this gateway forgot its cache
        _embed(_sdk(kiln, second))
    assert _embed(_sdk(kiln, third)) == 1
    assert _embed(_sdk(kiln, first)) == 1  # its own overlap has not ended


def test_a_key_is_created_with_the_keyboard_only(kiln: KilnProcess, page: Page) -> None:
    _keys_page(page)
    settled(page)
    _tab_to(page, page.locator("#new-key input[name=name]"))
    page.keyboard.type("typed")
    _tab_to(page, page.locator("#new-key button[type=submit]"))
    page.keyboard.press("Enter")
    expect(page.locator("#secret-value")).to_have_value(re.compile("^kiln_"))
    expect(page.locator("#keys tbody tr", has_text="typed")).to_have_count(1)
    assert axe_violations(page) == []  # the secret shown, the rows' rotate forms


def _tab_to(page: Page, target: Locator, most: int = 40) -> None:
    """Press Tab until ``target`` has the focus (fails after ``most`` presses)."""
    for _ in range(most):
        page.keyboard.press("Tab")
        if target.evaluate("e => e === document.activeElement"):
            break
    expect(target).to_be_focused()


def _pages(page: Page) -> list[str]:
    """Every console page linked from the landing page and on (downloads left out)."""
    seen: list[str] = [urlsplit(page.url).path]
    for path in seen:
        if path != seen[0]:
            page.goto(path)
        for link in page.evaluate(_LINKS):
            href = urlsplit(link).path  # one visit per page, whatever its query
            if href not in seen and not href.endswith(".csv"):
                seen.append(href)
    return seen


@pytest.mark.parametrize("email", list(USERS))
def test_every_page_passesaxe_violations(kiln: KilnProcess, page: Page, email: str) -> None:
    page.goto("/console/login")
    pages = {"/console/login": axe_violations(page)}
    page.evaluate("document.body.append(document.createElement('button'))")  # no name
    assert [v["id"] for v in axe_violations(page)] == ["button-name"]  # axe sees what it should
    sign_in(page, email)
    expect(page).not_to_have_url(re.compile("/login$"))
    for path in _pages(page):
        page.goto(path)
        pages[path] = axe_violations(page)
    bad = {path: found for path, found in pages.items() if found}
    print(email, len(pages), "pages;", {p: len(v) for p, v in pages.items()})
    assert not bad, bad
