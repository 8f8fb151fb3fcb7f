"""``GET /v1/models[/{id}]`` as Anthropic's Models API answers them, for a caller that sends
``anthropic-version`` (the ``anthropic`` SDK always does): ``{"type": "model", "id",
"display_name", "created_at"}`` entries, a list paged by ``limit`` (1-1000, default 20),
``after_id`` or ``before_id``, with ``has_more``, ``first_id`` and ``last_id`` (the SDK's
``models.list()`` pages on by ``after_id``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec

from kiln_platform.errors import BadRequest

if TYPE_CHECKING:
    from kiln_platform.gateway.schemas import ModelCard

VERSION_HEADER = "anthropic-version"
LIMIT, MAX_LIMIT = 20, 1000


class AnthropicModel(msgspec.Struct, kw_only=True):
    """One model, as Anthropic's ``ModelInfo``."""

    id: str
    display_name: str
    created_at: str
    """RFC 3339, UTC."""
    type: str = "model"


class AnthropicModelPage(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A page of models, as Anthropic's list."""

    data: list[AnthropicModel]
    has_more: bool
    first_id: str | None
    last_id: str | None


def model_of(card: ModelCard) -> AnthropicModel:
    """A model card in Anthropic's shape (its name is its display name)."""
    made = datetime.fromtimestamp(card.created, UTC).isoformat().replace("+00:00", "Z")
    return AnthropicModel(id=card.id, display_name=card.id, created_at=made)


def page(cards: list[ModelCard], query: Mapping[str, str]) -> AnthropicModelPage:
    """The page of ``cards`` the query's ``limit`` and ``after_id`` or ``before_id`` ask for."""
    limit = _limit(query.get("limit"))
    after, before = query.get("after_id"), query.get("before_id")
    if after is not None and before is not None:
        raise BadRequest("Give 'after_id' or 'before_id', not both.", param="before_id")
    start, end = 0, len(cards)
    if after is not None:
        start = _at(cards, after, "after_id") + 1
        end = min(start + limit, len(cards))
    elif before is not None:
        end = _at(cards, before, "before_id")
        start = max(0, end - limit)
    else:
        end = min(limit, len(cards))
    data = [model_of(card) for card in cards[start:end]]
    more = start > 0 if before is not None else end < len(cards)
    return AnthropicModelPage(data=data, has_more=more, first_id=data[0].id if data else None,
                              last_id=data[-1].id if data else None)  # fmt: skip


def _limit(given: str | None) -> int:
    if given is None:
        return LIMIT
    if not given.isdigit() or not 1 <= int(given) <= MAX_LIMIT:
        raise BadRequest(f"'limit' must be an integer from 1 to {MAX_LIMIT}.", param="limit")
    return int(given)


def _at(cards: list[ModelCard], model: str, field: str) -> int:
    for at, card in enumerate(cards):
        if card.id == model:
            return at
    raise BadRequest(f"'{field}': no model `{model}` in the list.", param=field)
