"""The console in a real browser: Debian's Chromium, driven by Playwright, against a real
``kiln up``. Users sign in, create and revoke API keys and OAuth clients, and use what they made
with the official ``openai`` client and the OAuth token endpoint; finance downloads costs."""

from __future__ import annotations

import csv
import io
import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from playwright.sync_api import Page, expect

from .conftest import PASSWORD, KilnProcess, settled, sign_in

USERS = {
    "admin@acme.test": ("tenant-admin", "acme"),
    "dev@acme.test": ("tenant-member", "acme"),
    "ops@kiln.test": ("platform-admin", None),
    "money@kiln.test": ("finance", None),
}
DataDir = AbstractContextManager[Path]
REVOKED_WITHIN_S = 5.0 + 5.0  # the key cache TTL, and slack for a loaded machine


@pytest.fixture(scope="module")
def kiln(
    start_kiln: Callable[..., KilnProcess], kiln_data_dir: Callable[[], DataDir], oidc_provider: Any
) -> Iterator[KilnProcess]:
    """``kiln up`` with no models, two tenants and a user of each role, made with the CLI; single
    sign-on through the test OpenID Connect provider."""
    sso = {"KILN_OIDC_ISSUER": oidc_provider.base_url, "KILN_OIDC_CLIENT_ID": "kiln-console",
           "KILN_OIDC_CLIENT_SECRET": "idp-secret"}  # fmt: skip
    with kiln_data_dir() as path:
        kiln = start_kiln(path, [], sso)
        try:
            for name in ("acme", "globex"):
                kiln.cli("tenants", "create", name)
            for email, (role, tenant) in USERS.items():
                where = ["--tenant", tenant] if tenant else []
                kiln.cli("users", "create", "--email", email, "--role", role, *where,
                         "--password", PASSWORD)  # fmt: skip
            yield kiln
        finally:
            if kiln.proc.poll() is None:
                kiln.stop()


def _refused_within(call: Callable[[], object], seconds: float) -> float:
    """Seconds until ``call`` raises an authentication error (fails after ``seconds``)."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        try:
            call()
        except (openai.AuthenticationError, httpx.HTTPStatusError):
            return time.monotonic() - started
        time.sleep(0.25)
    raise AssertionError(f"still accepted {seconds} s after revocation")


def test_a_tenant_admin_creates_uses_and_revokes_a_key(page: Page, kiln: KilnProcess) -> None:
    sign_in(page, "admin@acme.test", "not the password")
    expect(page.locator("#login-error")).to_have_text("Incorrect email or password.")
    sign_in(page, "admin@acme.test")
    expect(page).to_have_url(re.compile(r"/console/overview$"))
    page.click("header nav >> text=API keys")
    expect(page).to_have_url(re.compile(r"/console/tenants/[0-9a-f-]{36}/keys$"))
    expect(page.locator("h1")).to_contain_text("acme")

    page.fill("#new-key input[name=name]", "backend")
    page.click("#new-key button[type=submit]")
    secret = page.locator("#secret-value").input_value()
    assert secret.startswith("kiln_")
    row = page.locator("#keys tbody tr", has_text="backend")
    expect(row.locator(".status")).to_have_text("active")

    sdk = openai.OpenAI(api_key=secret, base_url=f"{kiln.base_url}/v1", max_retries=0)
    assert sdk.models.list().data == []  # the key works; acme has no models yet

    page.reload()
    assert secret not in page.content()  # shown once
    page.once("dialog", lambda dialog: dialog.accept())  # hx-confirm
    row.get_by_role("button", name="Revoke").click()
    expect(row.locator(".status")).to_have_text("revoked")
    _refused_within(sdk.models.list, REVOKED_WITHIN_S)


def test_an_oauth_client_made_in_the_console_gets_tokens(page: Page, kiln: KilnProcess) -> None:
    sign_in(page, "admin@acme.test")
    page.click("text=OAuth clients")
    page.fill("#new-client input[name=name]", "nightly")
    page.click("#new-client button[type=submit]")
    client_id = page.locator("#client-id-value").inner_text()
    secret = page.locator("#secret-value").input_value()

    def models() -> object:
        r = httpx.post(f"{kiln.base_url}/oauth/token", data={"grant_type": "client_credentials"},
                       auth=(client_id, secret))  # fmt: skip
        r.raise_for_status()
        bearer = {"authorization": f"Bearer {r.json()['access_token']}"}
        return httpx.get(f"{kiln.base_url}/v1/models", headers=bearer).raise_for_status()

    models()
    settled(page)  # the new row's buttons are live
    page.once("dialog", lambda dialog: dialog.accept())
    row = page.locator("#clients tbody tr", has_text=client_id)
    row.get_by_role("button", name="Revoke").click()
    expect(row.locator(".status")).to_have_text("revoked")
    _refused_within(models, REVOKED_WITHIN_S)


def test_bad_input_shows_the_field_and_keeps_the_form(page: Page) -> None:
    sign_in(page, "admin@acme.test")
    page.click("header nav >> text=API keys")
    page.fill("#new-key input[name=name]", "no scopes")
    page.uncheck("#new-key input[value=inference]")
    page.click("#new-key button[type=submit]")
    flash = page.locator("#flash .error")
    expect(flash).to_have_text("Choose at least one scope. (field 'scopes')")
    expect(page.locator("#new-key input[name=name]")).to_have_value("no scopes")
    expect(page.locator("#keys tbody tr", has_text="no scopes")).to_have_count(0)
    page.check("#new-key input[value=inference]")
    page.click("#new-key button[type=submit]")
    expect(page.locator("#keys tbody tr", has_text="no scopes")).to_have_count(1)
    expect(flash).to_have_count(0)  # a success clears the old error


def test_a_member_reads_keys_but_gets_no_buttons(page: Page) -> None:
    sign_in(page, "dev@acme.test")
    page.click("header nav >> text=API keys")
    expect(page.locator("#keys")).to_be_visible()
    expect(page.locator("#new-key")).to_have_count(0)
    expect(page.get_by_role("button", name="Revoke")).to_have_count(0)
    expect(page.locator("header nav")).not_to_contain_text("Costs")


def test_a_platform_admin_browses_every_tenant(page: Page) -> None:
    sign_in(page, "ops@kiln.test")
    expect(page).to_have_url(re.compile(r"/console/overview$"))
    page.click("header nav >> text=Tenants")
    expect(page).to_have_url(re.compile(r"/console/tenants$"))
    expect(page.locator("#tenants tbody tr")).to_have_count(2)
    globex = page.locator("#tenants tbody tr", has_text="globex")
    globex.get_by_role("link", name="API keys").click()
    expect(page.locator("h1")).to_contain_text("globex")
    expect(page.locator("#new-key")).to_be_visible()


def test_finance_reads_costs_and_downloads_the_csv(page: Page, kiln: KilnProcess) -> None:
    admin_key = kiln.cli("keys", "create", "--tenant", "acme", "--role", "platform-admin",
                         "--scope", "admin:write").strip().splitlines()[-1]  # fmt: skip
    auth = {"authorization": f"Bearer {admin_key}"}
    tenants = httpx.get(f"{kiln.base_url}/admin/v1/tenants", headers=auth).json()
    acme = next(t["id"] for t in tenants if t["name"] == "acme")
    period = time.strftime("%Y-%m", time.gmtime())
    r = httpx.post(f"{kiln.base_url}/admin/v1/tenants/{acme}/adjustments", headers=auth,
                   json={"amount_micros": 2_500_000, "reason": "support plan",
                         "corrects_period": period})  # fmt: skip
    assert r.status_code == 201, r.text

    sign_in(page, "money@kiln.test")
    expect(page).to_have_url(re.compile(r"/console/finance$"))  # finance lands on its overview
    page.get_by_role("link", name="Costs", exact=True).click()
    row = page.locator("#costs tbody tr:not(.subtotal)", has_text="acme")
    expect(row).to_contain_text("2.500000")
    with page.expect_download() as download:
        page.click("#csv")
    body = Path(download.value.path()).read_text()
    lines = list(csv.DictReader(io.StringIO(body)))
    assert [(r["BillingAccountName"], r["BilledCost"]) for r in lines] == [("acme", "2.500000")]
    expect(page.locator("header nav")).not_to_contain_text("API keys")


def test_single_sign_on_through_the_provider(page: Page, oidc_provider: Any) -> None:
    oidc_provider.email, oidc_provider.tamper = "Admin@Acme.test", None
    page.goto("/console/login")
    page.click("#sso")  # to the provider, which signs the user in and sends the browser back
    expect(page).to_have_url(re.compile(r"/console/overview$"))
    expect(page.locator("header .who")).to_contain_text("admin@acme.test (tenant-admin)")
    oidc_provider.email = "nobody@acme.test"
    page.click("text=Sign out")
    page.click("#sso")
    expect(page.locator("#login-error")).to_contain_text("No console account has the email")


def test_a_tenant_admin_adds_promotes_and_removes_a_user(page: Page) -> None:
    sign_in(page, "admin@acme.test")
    page.click("header nav >> text=Users")
    page.fill("#new-user input[name=email]", "new@acme.test")
    page.fill("#new-user input[name=password]", PASSWORD)
    page.click("#new-user button[type=submit]")
    row = page.locator("#users tbody tr[data-email='new@acme.test']")
    expect(row.locator("select[name=role]")).to_have_value("tenant-member")
    settled(page)  # the new row's form is live
    with page.expect_response(re.compile(r"/users/[0-9a-f-]{36}/role$")) as posted:
        row.locator("select[name=role]").select_option("tenant-admin")  # htmx posts on change
    assert posted.value.ok
    expect(page.locator("#users tbody tr[data-email='new@acme.test'] select")).to_have_value(
        "tenant-admin"
    )
    page.reload()  # it was saved, not only shown
    expect(row.locator("select[name=role]")).to_have_value("tenant-admin")
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Remove").click()
    expect(row).to_have_count(0)
    page.click("header nav >> text=Quotas")
    expect(page.locator("#limits")).to_contain_text("Requests per minute")


def test_signing_out_ends_the_session(page: Page) -> None:
    sign_in(page, "admin@acme.test")
    keys = page.url
    page.click("text=Sign out")
    expect(page).to_have_url(re.compile(r"/console/login$"))
    page.goto(keys)
    expect(page).to_have_url(re.compile(r"/console/login$"))


_WATCH_PROGRESS = """() => { window.progress = [];
  document.addEventListener("htmx:xhr:progress",
    () => window.progress.push(document.getElementById("import-progress").value)); }"""


def test_a_platform_admin_imports_a_model_and_reads_its_accuracy(
    page: Page, bert_tar: Path
) -> None:
    sign_in(page, "ops@kiln.test")
    page.click("header nav >> text=Models")
    settled(page)
    form = page.locator("#import-model")
    form.locator("input[name=name]").fill("tiny-bert")
    form.locator("input[name=file]").set_input_files(bert_tar)
    form.locator("select[name=precision]").select_option("fp32")
    page.evaluate(_WATCH_PROGRESS)
    form.locator("button[type=submit]").click()
    panel = page.locator("#import-job")
    phases: list[str] = []
    deadline = time.monotonic() + 300
    while panel.get_attribute("data-status") in (None, "queued", "running"):
        assert time.monotonic() < deadline, phases
        phase = panel.locator(".phase")
        if phase.count() and (text := phase.inner_text()) and (not phases or phases[-1] != text):
            phases.append(text)
        page.wait_for_timeout(100)
    expect(panel).to_have_attribute("data-status", "done")
    settled(page)
    progress = page.evaluate("window.progress")
    assert progress, "no htmx:xhr:progress event"
    assert max(progress) == 100, progress  # the upload's bar reached 100 %
    print("upload progress", progress, "build phases", phases)
    expect(page.locator("#import-progress")).to_be_visible()
    assert "checking accuracy" in phases or len(phases) > 1, phases  # phases went by live
    expect(panel.locator(".version")).to_have_text("1")
    assert float(panel.locator(".min-cosine").inner_text()) >= 0.9999
    row = page.locator("#model-tiny-bert details[data-version='1']")  # swapped in out of band
    expect(row.locator(".min-cosine")).to_have_count(1)
    page.reload()
    assert float(row.locator(".min-cosine").text_content() or "") >= 0.9999


def test_a_tenant_admin_sees_no_import_form(page: Page) -> None:
    sign_in(page, "admin@acme.test")
    page.goto("/console/models")
    expect(page.locator("h1")).to_have_text("Models")
    expect(page.locator("#import-model")).to_have_count(0)


def test_a_platform_admin_defines_an_slo_and_reads_alerts(page: Page) -> None:
    sign_in(page, "ops@kiln.test")
    page.click("header nav >> text=SLOs")
    form = page.locator("#new-slo")
    form.locator("input[name=name]").fill("chat-up")
    form.locator("input[name=model]").fill("support-llm")
    form.locator("input[name=availability]").fill("120")
    form.locator("button[type=submit]").click()
    expect(page.locator("#flash")).to_contain_text("'availability' must be a percentage")
    form.locator("input[name=availability]").fill("99.9")
    form.locator("input[name=latency]").fill("99")
    form.locator("input[name=latency_ms]").fill("250")
    form.locator("button[type=submit]").click()
    rows = page.locator("#slos tr[data-slo='chat-up']")
    expect(rows).to_have_count(2)  # one row per SLI
    expect(rows.locator(".budget")).to_have_text(["100.0 %", "100.0 %"])  # no events yet
    expect(rows.nth(1)).to_contain_text("< 250 ms")
    page.reload()  # stored, not only swapped in
    expect(rows).to_have_count(2)
    page.click("header nav >> text=Alerts")
    expect(page.locator("#firing")).to_contain_text("Nothing is firing.")
    expect(page.locator("#alerts")).to_have_attribute("hx-trigger", "every 5s")
    page.go_back()
    settled(page)
    page.once("dialog", lambda dialog: dialog.accept())
    rows.first.get_by_role("button", name="Delete").click()
    expect(rows).to_have_count(0)
