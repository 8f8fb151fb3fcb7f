"""Batch input files checked line by line as they stream in: errors name the line."""

from __future__ import annotations

import json

import pytest

from kiln_platform.batches.jsonl import LineChecker, check_line
from kiln_platform.errors import BadRequest

pytestmark = pytest.mark.unit


def _line(custom_id: str = "a", **over: object) -> bytes:
    item = {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "m", "input": "x"}, **over}  # fmt: skip
    return json.dumps(item).encode() + b"\n"


def _fed(data: bytes, size: int = 7, max_lines: int = 10) -> LineChecker:
    checker = LineChecker(max_lines=max_lines, max_line_bytes=1000)
    for i in range(0, len(data), size):  # lines split across chunks, as a body arrives
        checker.feed(data[i : i + size])
    checker.finish()
    return checker


def test_lines_split_across_chunks_are_counted_once_each() -> None:
    data = _line("a") + _line("b") + b"\n" + _line("c").rstrip(b"\n")  # no final newline
    assert _fed(data).lines == 3  # the blank line is no request
    assert _fed(data, size=1).lines == 3


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (b"{not json\n", "Line 2: not a valid JSON object."),
        (_line("x", method="GET"), "Line 2: 'method' is 'GET'"),
        (_line("x", url="/v1/images"), "Line 2: 'url' is '/v1/images'"),
        (_line("x", body={"input": "x"}), "Line 2: 'body.model' must name a model."),
        (_line("a"), "Line 2: 'custom_id' 'a' appears on an earlier line."),
        (_line("x", extra=1), "Line 2: Object contains unknown field `extra`"),
        (b"[1]\n", "Line 2: Expected `object`, got `array`"),
    ],
)
def test_a_bad_line_is_refused_with_its_number(bad: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as refused:
        _fed(_line("a") + bad + _line("z"))
    assert refused.value.message.startswith(message)
    assert refused.value.param == "line 2"


def test_limits_on_lines_and_line_length() -> None:
    with pytest.raises(BadRequest, match="more than 2 lines"):
        _fed(_line("a") + _line("b") + _line("c"), max_lines=2)
    with pytest.raises(BadRequest, match="Line 1: longer than 1000 bytes"):
        _fed(_line("a", body={"model": "m", "input": "x" * 2000}))
    with pytest.raises(BadRequest, match="no lines"):
        _fed(b"  \n")


def test_check_line_returns_the_request() -> None:
    item = check_line(1, _line("id-1"))
    assert (item.custom_id, item.url, item.body["model"]) == ("id-1", "/v1/embeddings", "m")
