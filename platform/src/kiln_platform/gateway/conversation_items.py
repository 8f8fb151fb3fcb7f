"""Conversation items and fields as requests give them: checked as ``/v1/responses`` input is
(so a conversation holds no item a response could not read), given ids, listed as the API lists
them; a response's ``conversation``; metadata. The store is ``gateway.conversations``."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from kiln_platform.errors import BadRequest
from kiln_platform.gateway import _response_input
from kiln_platform.gateway._items import with_parts
from kiln_platform.gateway.responses_schemas import InputItem

MAX_ITEMS = 20
"""Items one request may add (OpenAI's bound)."""
_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
           "reasoning": "rs"}  # fmt: skip


def metadata_of(given: Any, param: str = "metadata") -> dict[str, str]:
    """OpenAI's metadata: at most 16 string pairs, keys to 64 characters, values to 512."""
    if given is None:
        return {}
    if (
        not isinstance(given, dict)
        or len(given) > 16
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in given.items()
        )
    ):
        raise BadRequest(f"'{param}' takes at most 16 string pairs (keys to 64 characters, "
                         "values to 512).", param=param)  # fmt: skip
    return dict(given)


def conversation_id(given: Any, previous_response_id: str | None) -> str | None:
    """The conversation a ``/v1/responses`` request names (an id, or ``{"id": …}``), if any."""
    if given is None:
        return None
    ident = given.get("id") if isinstance(given, dict) else given
    if not isinstance(ident, str) or not ident:
        raise BadRequest("'conversation' is a conversation id or {\"id\": <id>}.",
                         param="conversation")  # fmt: skip
    if previous_response_id is not None:
        raise BadRequest("Set one of 'conversation' and 'previous_response_id'.",
                         param="conversation")  # fmt: skip
    return ident


def named(given: Any) -> dict[str, str] | None:
    """A response's ``conversation``: ``{"id": …}`` of the one its request named, or None."""
    ident = conversation_id(given, None)
    return None if ident is None else {"id": ident}


def items_of(given: Any) -> list[dict[str, Any]]:
    """Items a request adds (``items``, at most ``MAX_ITEMS``), checked as ``/v1/responses``
    input is (so a conversation holds no item a response could not read), then ``ided``."""
    if not isinstance(given, list) or len(given) > MAX_ITEMS:
        raise BadRequest(f"'items' is a list of at most {MAX_ITEMS} items.", param="items")
    try:
        items = msgspec.convert(given, list[InputItem])
        _response_input.messages(items)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"{exc} (in 'items').", param="items") from None
    except BadRequest as exc:
        named = exc.param and exc.param.replace("input[", "items[", 1)
        raise BadRequest(exc.message.replace("'input[", "'items[", 1), param=named) from None
    return ided(msgspec.to_builtins(items))


def ided(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Checked input items as a conversation keeps them: each with an id of its own (unset
    fields dropped), listed as the API lists them."""
    return [
        listed({**{k: v for k, v in item.items() if v is not None},
                "id": f"{_PREFIX[item.get('type', 'message')]}_{uuid.uuid4().hex}"})
        for item in items
    ]  # fmt: skip


def listed(item: dict[str, Any]) -> dict[str, Any]:
    """An item as the API lists it: a message's text as a content part, its status set."""
    if item.get("type", "message") != "message":
        return item
    return {"type": "message", "status": "completed", **with_parts(item)}
