"""Alert notifications: Alertmanager's webhook shape, the signature a receiver verifies."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import msgspec

from kiln_platform.slo import notify
from kiln_platform.slo.rules import duration, latency_bound, workbook_name
from kiln_platform.slo.tables import Alert

KEY = b"shared"
LABELS = {"alertname": "KilnSLOBurnRate", "slo": "s", "model": "m", "sli": "availability",
          "severity": "page"}  # fmt: skip


def _alert(status: str = "firing", ends: datetime | None = None) -> Alert:
    return Alert(
        fingerprint="abc", name="KilnSLOBurnRate", status=status, labels=LABELS,
        annotations={"summary": "x"}, starts_at=datetime(2026, 12, 1, 20, tzinfo=UTC),
        ends_at=ends,
    )  # fmt: skip


def test_payload_is_alertmanagers_webhook_with_an_id() -> None:
    body = notify.payload(_alert(), "n-1")
    assert body["version"] == "4"
    assert body["notificationId"] == "n-1"
    assert body["status"] == "firing"
    [alert] = body["alerts"]
    assert alert["labels"] == LABELS
    assert alert["startsAt"] == "2026-12-01T20:00:00Z"
    assert alert["endsAt"] == "0001-01-01T00:00:00Z"  # Alertmanager's zero time: still firing
    assert alert["fingerprint"] == "abc"
    done = notify.payload(_alert("resolved", datetime(2026, 12, 1, 21, tzinfo=UTC)), "n-2")
    assert done["alerts"][0]["endsAt"] == "2026-12-01T21:00:00Z"


def test_signature_verifies_only_the_same_body_key_and_a_fresh_time() -> None:
    body = msgspec.json.encode(notify.payload(_alert(), "n-1"))
    now = int(time.time())
    header = notify.sign(KEY, body, now)
    assert notify.verify(KEY, body, header)
    assert not notify.verify(b"other", body, header)
    assert not notify.verify(KEY, body.replace(b"firing", b"resolvd"), header)
    assert not notify.verify(KEY, body, notify.sign(KEY, body, now - 3600))  # replayed late
    assert not notify.verify(KEY, body, "v1=00")


def test_rule_helpers() -> None:
    assert [workbook_name(s) for s in (300, 3600, 86_400, 21_600)] == ["5m", "1h", "1d", "6h"]
    assert duration(2.5) == "3s"
    assert duration(0.2) == "1s"
    assert latency_bound(300) == 0.3
    assert latency_bound(320) == 0.3  # between bounds: the stricter one
    assert latency_bound(1) == 0.01
