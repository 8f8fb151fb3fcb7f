"""A batch line that asks for what a batch cannot do is its line's 400, naming the field, before
anything is admitted or dispatched (``_call`` reaches no database and no worker for these)."""

from __future__ import annotations

from typing import Any

import pytest

from kiln_platform.batches.lines import _call
from kiln_platform.errors import BadRequest

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
RESPONSE = {"model": "m", "input": "hi"}


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("/v1/chat/completions", {**CHAT, "stream": True}, "body.stream"),
        ("/v1/completions", {"model": "m", "prompt": "hi", "stream": True}, "body.stream"),
        ("/v1/responses", {**RESPONSE, "stream": True}, "body.stream"),
        ("/v1/responses", {**RESPONSE, "background": True}, "body.background"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": "5"}, "body"),
    ],
)
async def test_a_line_asking_what_a_batch_cannot_do_is_a_400_naming_it(
    endpoint: str, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(BadRequest) as raised:
        await _call(None, None, endpoint, body)  # type: ignore[arg-type]
    assert raised.value.param == param
    assert raised.value.status_code == 400
