"""Anthropic's model list pages: ``limit``, ``after_id`` and ``before_id`` as its API pages,
and a bad one is a 400 naming the field."""

from __future__ import annotations

import pytest

from kiln_platform.errors import BadRequest
from kiln_platform.gateway.anthropic_models import model_of, page
from kiln_platform.gateway.schemas import ModelCard

CARDS = [ModelCard(id=name, created=1_700_000_000) for name in "abcde"]


@pytest.mark.parametrize(
    ("query", "ids", "more"),
    [
        ({}, "abcde", False),
        ({"limit": "2"}, "ab", True),
        ({"limit": "2", "after_id": "b"}, "cd", True),
        ({"limit": "2", "after_id": "d"}, "e", False),
        ({"after_id": "e"}, "", False),
        ({"limit": "2", "before_id": "d"}, "bc", True),
        ({"limit": "3", "before_id": "c"}, "ab", False),
    ],
)
def test_pages_follow_anthropics_cursors(query: dict[str, str], ids: str, more: bool) -> None:
    got = page(CARDS, query)
    assert [m.id for m in got.data] == list(ids)
    assert got.has_more is more
    assert (got.first_id, got.last_id) == ((ids[0], ids[-1]) if ids else (None, None))


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"after_id": "z"}, "after_id"),
        ({"before_id": "z"}, "before_id"),
        ({"after_id": "a", "before_id": "c"}, "before_id"),
    ],
)
def test_a_bad_query_is_a_400_naming_its_field(query: dict[str, str], field: str) -> None:
    with pytest.raises(BadRequest) as refused:
        page(CARDS, query)
    assert refused.value.param == field


def test_a_model_is_anthropics_model_info() -> None:
    assert model_of(CARDS[0]).created_at == "2023-11-14T22:13:20Z"
