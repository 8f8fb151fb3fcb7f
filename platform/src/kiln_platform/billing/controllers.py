"""`/admin/v1/price-books`: thin handlers, behaviour in ``billing.pricebooks``."""

from __future__ import annotations

from litestar import get, post

from kiln_platform.admin.deps import AdminController, CallDep
from kiln_platform.billing import pricebooks
from kiln_platform.billing.schemas import PriceBookCreate, PriceBookView


class PriceBooksController(AdminController):
    """Price-book versions: published by platform-admins, read by finance.

    Reads use a plain session: price books belong to no tenant, so the tenant role's row-level
    security (which a tenant-confined finance key runs under) has nothing to hide in them.
    """

    opt = {"resource": "price-books"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/price-books")
    async def list_books(self, call: CallDep) -> list[PriceBookView]:
        """Every version, oldest first."""
        async with call.kiln.db.sessions() as session:
            return await pricebooks.list_books(session, call.actor)

    @get("/price-books/{version:int}")
    async def get_book(self, call: CallDep, version: int) -> PriceBookView:
        """One version."""
        async with call.kiln.db.sessions() as session:
            return await pricebooks.get_book(session, call.actor, version)

    @post("/price-books", status_code=201)
    async def create_book(self, call: CallDep, data: PriceBookCreate) -> PriceBookView:
        """Publish a new version (platform-admin); gateways price with it within 5 s of its
        ``effective_from``."""
        return await pricebooks.create_book(await call.session(), call.actor, data)
