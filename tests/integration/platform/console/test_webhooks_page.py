"""The console's webhooks page: a tenant-admin registers an endpoint (the secret shown once, a
private target refused in the flash), sees its delivery log and redelivers; a member reads."""

from __future__ import annotations

import re

import pytest
from pydantic import SecretStr
from sqlalchemy import update

from kiln_platform.settings import Settings
from kiln_platform.webhooks import events
from kiln_platform.webhooks.tables import WebhookDelivery

from .conftest import App

HX = {"hx-request": "true"}


@pytest.fixture(scope="module")
def settings(database_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """No worker; loopback targets allowed; a poll slower than the test (nothing is sent)."""
    return Settings(
        data_dir=tmp_path_factory.mktemp("data"), database_url=database_uri,
        secret_key=SecretStr("console-test-secret"), pool_initial_replicas=0,
        webhook_allow_networks="127.0.0.0/8", webhook_poll_s=3600,
    )  # fmt: skip


async def test_a_tenant_admin_registers_an_endpoint_and_reads_its_log(app: App) -> None:
    tenant = await app.tenant()
    base = f"/console/tenants/{tenant}/webhooks"
    async with app.signed_in(await app.user("tenant-admin", tenant)) as (http, token):
        headers = {**HX, "x-csrftoken": token}
        page = await http.get(base)
        assert page.status_code == 200
        assert 'id="new-webhook"' in page.text
        assert "budget.threshold_reached" in page.text
        refused = await http.post(base, headers=headers, data={
            "url": "http://10.0.0.1/hook", "events": ["batch.failed"]})  # fmt: skip
        assert refused.status_code == 400
        assert "KILN_WEBHOOK_ALLOW_NETWORKS" in refused.text
        form = {"url": "http://127.0.0.1:9/hook", "events": ["batch.failed", "batch.completed"]}
        made = await http.post(base, headers=headers, data=form)
        assert made.status_code == 201, made.text
        secret = re.search(r'value="(whsec_[^"]+)"', made.text)
        assert secret is not None
        endpoint = re.search(rf"{base}/([0-9a-f-]{{36}})\"", made.text)
        assert endpoint is not None
        assert secret.group(1) not in (await http.get(base)).text  # shown once

        async with app.kiln.db.sessions.begin() as session:
            await events.emit(session, tenant, "batch.failed", {"id": "batch_1"})
            await session.execute(update(WebhookDelivery).values(state="failed", attempts=9))
        log = await http.get(f"{base}/{endpoint.group(1)}")
        assert log.status_code == 200
        assert "<td>batch.failed</td>" in log.text
        assert "<td>failed</td>" in log.text
        delivery = re.search(r'id="delivery-([0-9a-f-]{36})"', log.text)
        assert delivery is not None
        one = f"{base}/{endpoint.group(1)}"
        again = await http.post(f"{one}/deliveries/{delivery.group(1)}/redeliver", headers=headers)
        assert again.status_code == 200, again.text
        assert "pending" in again.text

    async with app.signed_in(await app.user("tenant-member", tenant)) as (http, token):
        page = await http.get(base)
        assert page.status_code == 200
        assert "127.0.0.1:9/hook" in page.text
        assert 'id="new-webhook"' not in page.text
        r = await http.post(
            f"{base}/{endpoint.group(1)}/delete", headers={**HX, "x-csrftoken": token}
        )
        assert r.status_code == 403
