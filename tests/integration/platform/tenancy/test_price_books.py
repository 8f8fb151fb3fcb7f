"""`/admin/v1/price-books`: versions numbered in order, validation naming the field, audited
writes by platform-admins only, reads by finance."""

from __future__ import annotations

from typing import Any

from .conftest import Admin

BOOK: dict[str, Any] = {
    "prices": [
        {"model": "m", "unit": "input_token", "unit_price_micros": "0.25"},
        {"model": "m", "model_version": "2", "unit": "output_token", "unit_price_micros": "1.5"},
    ],
    "discounts": {"pro": 1000},
    "effective_from": "2026-01-01T00:00:00Z",
    "currency": "EUR",
}


async def test_publish_list_and_get_versions(admin: Admin, root: str) -> None:
    first = await admin.call("POST", "/admin/v1/price-books", root, json=BOOK)
    assert first.status_code == 201, first.text
    second = await admin.call(
        "POST",
        "/admin/v1/price-books",
        root,
        json={**BOOK, "effective_from": "2027-01-01T00:00:00Z"},
    )
    assert (first.json()["version"], second.json()["version"]) == (1, 2)
    got = (await admin.call("GET", "/admin/v1/price-books/1", root)).json()
    assert got["currency"] == "EUR"
    assert got["discounts"] == {"pro": 1000}
    assert got["prices"] == [
        {"model": "m", "model_version": "*", "unit": "input_token", "unit_price_micros": "0.25"},
        {"model": "m", "model_version": "2", "unit": "output_token", "unit_price_micros": "1.5"},
    ]
    listed = (await admin.call("GET", "/admin/v1/price-books", root)).json()
    assert [b["version"] for b in listed] == [1, 2]
    assert (await admin.call("GET", "/admin/v1/price-books/99", root)).status_code == 404
    books = await admin.kiln.books.all()
    assert [b.version for b in books][-2:] == [1, 2]
    assert str(books[0].unit_price("m", "7", "input_token")) == "0.25"


async def test_validation_names_the_field(admin: Admin, root: str) -> None:
    cases = {
        "prices[0].unit": {**BOOK, "prices": [{"model": "m", "unit": "token",
                                               "unit_price_micros": "1"}]},
        "prices[0].unit_price_micros": {**BOOK, "prices": [{"model": "m", "unit": "request",
                                                            "unit_price_micros": "0.0000001"}]},
        "prices[1]": {**BOOK, "prices": [BOOK["prices"][0], BOOK["prices"][0]]},
        "effective_from": {**BOOK, "effective_from": "2026-01-01T00:00:00"},
        "prices": {**BOOK, "prices": []},
    }  # fmt: skip
    for param, body in cases.items():
        r = await admin.call("POST", "/admin/v1/price-books", root, json=body)
        assert r.status_code == 400, (param, r.text)
        assert f"'{param}'" in r.json()["detail"], (param, r.json())
    negative = {**BOOK, "prices": [{"model": "m", "unit": "request", "unit_price_micros": "-1"}]}
    assert (
        await admin.call("POST", "/admin/v1/price-books", root, json=negative)
    ).status_code == 400


async def test_finance_reads_and_only_platform_admins_publish(admin: Admin, root: str) -> None:
    tenant = await admin.tenant(root, "pb-finance")
    finance = await admin.key(root, tenant, scopes=["admin:read"], role="finance")
    tenant_admin = await admin.key(root, tenant, scopes=["admin:read", "admin:write"])
    assert (await admin.call("GET", "/admin/v1/price-books", finance)).status_code == 200
    for key in (finance, tenant_admin):
        r = await admin.call("POST", "/admin/v1/price-books", key, json=BOOK)
        assert r.status_code == 403
