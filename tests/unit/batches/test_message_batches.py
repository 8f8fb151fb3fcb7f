"""Anthropic's Message Batches read from Kiln's batches: the processing status and request
counts of each batch status, each recorded line as its result, and the requests checked when
the batch is made (a 400 naming the request and field)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from kiln_platform.batches.message_batch_results import result
from kiln_platform.batches.message_batch_schemas import BatchRequest, MessageBatchCreate
from kiln_platform.batches.message_batches import lines_of, shaped
from kiln_platform.batches.schemas import BatchObject, RequestCounts
from kiln_platform.errors import BadRequest

HEX = "0" * 32
PARAMS = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}


def _batch(status: str, completed: int, failed: int, **times: Any) -> BatchObject:
    return BatchObject(id=f"batch_{HEX}", endpoint="/v1/messages", input_file_id=None,
                       completion_window="24h", status=status,  # type: ignore[arg-type]
                       created_at=1_700_000_000, expires_at=1_700_086_400,
                       request_counts=RequestCounts(total=10, completed=completed, failed=failed),
                       **times)  # fmt: skip


@pytest.mark.parametrize(
    ("status", "expired", "times", "want", "counts"),
    [
        ("in_progress", 0, {}, "in_progress", (6, 3, 1, 0, 0)),
        ("cancelling", 0, {"cancelling_at": 1_700_000_100}, "canceling", (6, 3, 1, 0, 0)),
        ("cancelled", 0, {"cancelled_at": 1_700_000_200}, "ended", (0, 3, 1, 6, 0)),
        ("expired", 5, {"expired_at": 1_700_086_400}, "ended", (0, 3, 1, 0, 5)),
        ("failed", 0, {"failed_at": 1_700_000_050}, "ended", (0, 3, 7, 0, 0)),
    ],
)
def test_each_status_reads_as_anthropics(
    status: str, expired: int, times: dict[str, int], want: str, counts: tuple[int, ...]
) -> None:
    failed = 1 + expired
    batch = shaped(_batch(status, 3, failed, **times), expired, "http://k")
    assert (batch.id, batch.processing_status) == (f"msgbatch_{HEX}", want)
    c = batch.request_counts
    assert (c.processing, c.succeeded, c.errored, c.canceled, c.expired) == counts
    assert batch.created_at == "2023-11-14T22:13:20Z"
    assert (batch.ended_at is None) is (want != "ended")
    assert (batch.results_url == f"http://k/v1/messages/batches/msgbatch_{HEX}/results") is (
        want == "ended")  # fmt: skip


def test_each_recorded_line_is_its_result() -> None:
    ok = {"response": {"status_code": 200, "body": {"id": "msg_1"}}, "error": None}
    bad = {"response": {"status_code": 400, "body": {"error": {"message": "no"}}}, "error": None}
    late = {"response": None, "error": {"code": "batch_expired", "message": "late"}}
    succeeded = {"type": "succeeded", "message": {"id": "msg_1"}}
    assert result("a", ok) == {"custom_id": "a", "result": succeeded}
    assert result("b", bad)["result"] == {"type": "errored", "error": {
        "type": "error", "error": {"type": "invalid_request_error", "message": "no"}}}  # fmt: skip
    assert result("c", late)["result"] == {"type": "expired"}


@pytest.mark.parametrize(
    ("requests", "field"),
    [
        ([], "requests"),
        ([("a b", PARAMS)], "requests[0].custom_id"),
        ([("a", PARAMS), ("a", PARAMS)], "requests[1].custom_id"),
        ([("a", {**PARAMS, "stream": True})], "requests[0].params.stream"),
        ([("a", {**PARAMS, "max_tokens": None})], "requests[0].params.max_tokens"),
        ([("a", {**PARAMS, "nope": 1})], "requests[0].params"),
        ([("a", PARAMS), ("b", {**PARAMS, "model": "n"})], "requests[1].params.model"),
    ],
)
def test_a_bad_request_refuses_the_batch_naming_it(
    requests: list[tuple[str, dict[str, Any]]], field: str
) -> None:
    data = MessageBatchCreate(requests=[BatchRequest(custom_id=c, params=p) for c, p in requests])
    with pytest.raises(BadRequest) as refused:
        lines_of(data, 100)
    assert refused.value.param == field


def test_good_requests_are_message_lines() -> None:
    data = MessageBatchCreate(requests=[BatchRequest(custom_id="a-1", params=PARAMS)])
    (line,), tokens = lines_of(data, 100)
    assert msgspec.json.decode(line) == {"custom_id": "a-1", "method": "POST",
                                         "url": "/v1/messages", "body": PARAMS}  # fmt: skip
    assert tokens == 1 + 8  # "Hi" and the most it may write
