"""A dispatched request carries what is left of its deadline to the worker, and the call is
bounded by it: the worker drops work that cannot finish in time, and a late answer is a 504 at
the deadline instead of a 200 after it (issue 23, overload)."""

from __future__ import annotations

import aiohttp

from kiln_platform.gateway.dispatch import _bounded
from kiln_runtimes.protocol import EmbedRequest, GenerateRequest, InferRequest

LIMIT = aiohttp.ClientTimeout(total=60)


def test_an_embeddings_request_carries_what_is_left_of_its_deadline() -> None:
    sent, bound = _bounded(EmbedRequest(request_id="r", input_ids=[[1, 2]]), LIMIT, 1.25)
    assert sent.timeout_ms == 1150  # less ANSWER_MARGIN_S: the gateway's work after it
    assert bound.total == 1.15
    short, _ = _bounded(EmbedRequest(request_id="r", input_ids=[[1, 2]]), LIMIT, 0.2)
    assert short.timeout_ms == 180  # a tenth of a short deadline


def test_a_tighter_timeout_of_the_message_is_kept() -> None:
    request = InferRequest(request_id="r", inputs=[], timeout_ms=500)
    sent, bound = _bounded(request, LIMIT, 2.0)
    assert sent.timeout_ms == 500
    assert bound.total == 0.5


def test_a_spent_deadline_still_sends_a_positive_budget() -> None:
    sent, _ = _bounded(EmbedRequest(request_id="r", input_ids=[[1]]), LIMIT, -0.3)
    assert sent.timeout_ms == 1  # the worker expires it at once


def test_no_deadline_and_generations_are_left_alone() -> None:
    embed = EmbedRequest(request_id="r", input_ids=[[1]])
    assert _bounded(embed, LIMIT, None) == (embed, LIMIT)
    gen = GenerateRequest(request_id="r", prompt_ids=[1], max_tokens=4)
    assert _bounded(gen, LIMIT, 0.5) == (gen, LIMIT)
