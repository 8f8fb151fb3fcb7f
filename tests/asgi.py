"""Litestar apps as httpx's in-process transports type them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from litestar import Litestar


def asgi(app: Litestar) -> Any:
    """``app`` for ``httpx.ASGITransport(app=...)``.

    Both are ASGI 3, but httpx declares its app over ``MutableMapping`` scopes and messages while
    Litestar's ``__call__`` takes its own typed dicts, so mypy sees no overlap. This is the one
    place the two are bridged.
    """
    return app
