"""``response_format`` compiled to the grammar the worker follows, or a 400 naming the field."""

from __future__ import annotations

import json
from typing import Any

import llguidance
import pytest

from kiln_platform.errors import BadRequest
from kiln_platform.gateway._structured import grammar


def test_text_is_free_and_json_modes_compile_to_valid_grammars() -> None:
    assert grammar(None) is None
    assert grammar({"type": "text"}) is None
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for fmt, wanted in [
        ({"type": "json_object"}, {"type": "object"}),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, schema),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, {}),
    ]:
        compiled = grammar(fmt)
        assert compiled is not None
        assert llguidance.LLMatcher.validate_grammar(compiled) == ""
        (only,) = json.loads(compiled)["grammars"]
        assert {k: v for k, v in only["json_schema"].items() if k != "x-guidance"} == wanted
        assert only["json_schema"]["x-guidance"]["whitespace_flexible"] is False


@pytest.mark.parametrize(
    ("fmt", "param"),
    [
        ("json", "response_format"),
        ({"type": "xml"}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": [1]}},
         "response_format.json_schema.schema"),
        ({"type": "json_schema", "json_schema": {"schema": {"type": "frob"}}},
         "response_format.json_schema.schema"),
    ],
)  # fmt: skip
def test_what_cannot_run_is_a_400_naming_it(fmt: Any, param: str) -> None:
    with pytest.raises(BadRequest) as refused:
        grammar(fmt)
    assert refused.value.param == param
    assert f"'{param}'" in refused.value.message
