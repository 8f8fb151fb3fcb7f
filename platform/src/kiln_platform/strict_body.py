"""JSON bodies decoded strictly: a handler whose ``data`` is a msgspec Struct gets its body
decoded straight into it with ``strict=True``. Litestar converts every parameter with
``strict=False`` (query strings need it), which made ``"max_tokens": "5"`` a 5; OpenAI's API
answers such a body with a 400 naming the field, and so does Kiln now. One decode, not two:
the signature model passes the Struct through as it is."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request
from litestar.exceptions import ValidationException
from litestar.handlers import BaseRouteHandler
from litestar.types import Empty


def struct_of(handler: BaseRouteHandler) -> type[msgspec.Struct] | None:
    """The handler's ``data`` type, if it is a msgspec Struct (else Litestar decodes it)."""
    field = handler.parsed_data_field
    target = field.annotation if field is not None else None
    if isinstance(target, type) and issubclass(target, msgspec.Struct):
        return target
    return None


class StrictRequest(Request[Any, Any, Any]):
    """Litestar's request, with ``json()`` strict for a Struct ``data`` (``struct_of``)."""

    async def json(self) -> Any:
        """The body as the handler's Struct; a 400 naming the field it does not fit."""
        target = struct_of(self.route_handler)
        if target is None or self._json is not Empty:
            return await super().json()
        try:
            value = msgspec.json.decode(await self.body(), type=target, strict=True)
        except msgspec.ValidationError as exc:
            message, _, where = str(exc).partition(" - at `")
            raise ValidationException(
                detail=f"Validation failed for {self.method} {self.url.path}",
                extra=[{"message": message, "key": where.rstrip("`"), "source": "body"}],
            ) from exc
        except msgspec.DecodeError:  # not JSON: Litestar's own error for it
            return await super().json()
        self._json = self._connection_state.json = value
        return value
