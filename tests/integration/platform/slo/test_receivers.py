"""Alert receivers as data: two webhooks added through ``/admin/v1/alert-receivers`` (audited,
keys sealed at rest) each get every notification, signed with their own key; a refused
delivery is retried to that receiver alone, with the same id; a deleted receiver gets no more.
The real app in-process, a real PostgreSQL, real receivers on loopback."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from aiohttp import web
from cryptography.exceptions import InvalidTag
from pydantic import SecretStr
from sqlalchemy import select

from kiln_platform.app import create_app
from kiln_platform.db.tables import AuditRecord
from kiln_platform.keys.services import insert_key
from kiln_platform.settings import Settings
from kiln_platform.slo import notify
from kiln_platform.slo.receivers import receiver_seal
from kiln_platform.slo.tables import Alert, AlertReceiver
from kiln_platform.tenants.services import insert_tenant
from tests.asgi import asgi

from ..conftest import serving
from .hooks import loopback


class Hook:
    """Keeps the notifications whose signature its key verifies; refuses the first of each id
    if ``flaky``."""

    def __init__(self, *, flaky: bool = False) -> None:
        self.key = b""
        self.flaky = flaky
        self.seen: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if not notify.verify(self.key, body, request.headers[notify.SIGNATURE_HEADER]):
            return web.Response(status=401)
        note = msgspec.json.decode(body)
        first = note["notificationId"] not in {n["notificationId"] for n in self.seen}
        self.seen.append(note)
        return web.Response(status=503 if self.flaky and first else 204)


async def _alert(app: Any, name: str) -> None:
    """A firing alert stored as the monitor stores one (with its notification)."""
    async with app.state.kiln.db.sessions.begin() as session:
        alert = Alert(
            fingerprint=uuid.uuid4().hex[:16], name=name, status="firing",
            labels={"alertname": name}, annotations={}, starts_at=datetime.now(UTC),
        )  # fmt: skip
        session.add(alert)
        await notify.enqueue(session, alert)


async def test_every_receiver_gets_each_notification_signed_with_its_own_key(
    database_uri: str, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path, database_url=database_uri, secret_key=SecretStr("receivers"),
        log_level="error", slo_eval_interval_s=3600, alert_retry_s=0.2,
    )  # fmt: skip
    app = create_app(settings)
    steady, flaky = Hook(), Hook(flaky=True)
    async with (
        serving(app), loopback(steady.handle) as steady_url, loopback(flaky.handle) as flaky_url,
    ):  # fmt: skip
        kiln = app.state.kiln
        async with kiln.db.sessions.begin() as session:
            tenant = await insert_tenant(session, f"ops-{uuid.uuid4().hex[:6]}")
            scopes = frozenset({"admin:read", "admin:write"})
            _, admin = await insert_key(
                session, settings.hmac_key(), tenant.id, role="platform-admin", scopes=scopes
            )
        transport = httpx.ASGITransport(app=asgi(app))
        headers = {"authorization": f"Bearer {admin}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://kiln.test",
                                     headers=headers) as client:  # fmt: skip
            r = await client.post("/admin/v1/alert-receivers",
                                  json={"name": "pager", "url": steady_url})  # fmt: skip
            assert r.status_code == 201, r.text
            steady.key = r.json()["secret"].encode()  # generated, shown once
            chosen = "a-key-the-operator-chose"
            chat_receiver = {"name": "chat", "url": flaky_url, "secret": chosen}
            r = await client.post("/admin/v1/alert-receivers", json=chat_receiver)
            assert r.status_code == 201, r.text
            flaky.key, chat = chosen.encode(), r.json()["receiver"]["id"]
            listed = (await client.get("/admin/v1/alert-receivers")).json()
            assert [x["name"] for x in listed] == ["chat", "pager"]
            assert all("secret" not in x for x in listed)

            async with kiln.db.sessions() as session:  # sealed at rest, bound to its row
                rows = {r.name: r for r in await session.scalars(select(AlertReceiver))}
            seal = receiver_seal(settings.hmac_key())
            assert chosen.encode() not in rows["chat"].secret_sealed
            with pytest.raises(InvalidTag):
                seal.open(rows["chat"].secret_sealed, rows["pager"].id.bytes)

            await _alert(app, "KilnTestOne")
            await kiln.slos.tick()
            await asyncio.sleep(0.3)
            await kiln.slos.tick()  # the flaky receiver's retry is due
            assert len(steady.seen) == 1
            assert steady.seen[0]["receiver"] == "pager"
            ids = [n["notificationId"] for n in flaky.seen]
            assert len(ids) == 2
            assert ids[0] == ids[1] == steady.seen[0]["notificationId"]  # one id, retried

            assert (await client.delete(f"/admin/v1/alert-receivers/{chat}")).status_code == 204
            await _alert(app, "KilnTestTwo")
            await kiln.slos.tick()
            assert [n["alerts"][0]["labels"]["alertname"] for n in steady.seen] == [
                "KilnTestOne", "KilnTestTwo"
            ]  # fmt: skip
            assert len(flaky.seen) == 2  # deleted: nothing more

        async with kiln.db.sessions() as session:
            actions = await session.scalars(
                select(AuditRecord.action).where(AuditRecord.target_type == "alert-receiver")
            )
            assert sorted(actions) == ["alert-receiver.create"] * 2 + ["alert-receiver.delete"]
