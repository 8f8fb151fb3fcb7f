"""Version skew the other way round from ``test_worker_http``: a gateway older than its worker
reads a refusal code it does not know, and a body that is no ``ErrorReply`` at all, as an error
its client can act on, never as a decoding failure."""

from __future__ import annotations

import msgspec

from kiln_platform.errors import BadRequest, KilnError, ServiceUnavailable
from kiln_platform.gateway import dispatch


def _body(code: str, retry_after_s: float | None = None) -> bytes:
    reply = {"code": code, "message": f"refused: {code}", "retry_after_s": retry_after_s}
    return msgspec.msgpack.encode(reply)


def test_a_known_code_keeps_its_error() -> None:
    error = dispatch._error(_body("bad_request"))
    assert isinstance(error, BadRequest)
    assert error.message == "refused: bad_request"


def test_a_refusal_names_the_field_the_worker_names() -> None:
    reply = {"code": "bad_request", "message": "no prompt scores", "param": "prompt_logprobs"}
    error = dispatch._error(msgspec.msgpack.encode(reply))
    assert isinstance(error, BadRequest)
    assert error.param == "prompt_logprobs"
    assert dispatch._error(_body("bad_request")).param is None  # an older worker names none


def test_a_newer_workers_code_is_a_503_when_it_says_when_to_retry_else_a_500() -> None:
    transient = dispatch._error(_body("quota_of_the_future", 0.5))
    assert type(transient) is ServiceUnavailable
    assert (transient.message, transient.retry_after) == ("refused: quota_of_the_future", 0.5)
    lasting = dispatch._error(_body("quota_of_the_future"))
    assert type(lasting) is KilnError
    assert lasting.status_code == 500


def test_a_body_that_is_no_error_reply_is_a_500_naming_the_worker() -> None:
    for body in (b"<html>502 Bad Gateway</html>", msgspec.msgpack.encode({"code": 3})):
        error = dispatch._error(body)
        assert type(error) is KilnError
        assert "worker" in error.message
