"""A chat stream's answer while it may be tool calls (``tool_choice``): held, its words sent
as soon as they are known not to open a call, its calls whole once the choice ends; and the
ids a response's objects carry (``ident``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln_platform.gateway.llm import Piece
from kiln_platform.gateway.llm_schemas import Delta, ToolCall, ToolCallDelta

if TYPE_CHECKING:
    from collections.abc import Callable

    from kiln_platform.gateway.llm import Generation


def ident(prefix: str, gen: Generation) -> str:
    """The object id a response of ``gen`` carries: ``<prefix>-<request id>``."""
    return f"{prefix}-{gen.request.request_id.removeprefix('req_')}"


def tool_calls(gen: Generation, index: int, text: str, finish: str) -> list[ToolCall] | None:
    """A choice's answer as the tool calls the request asked for (``None``: it is text, or
    was cut before the call was whole)."""
    if gen.tools is None or finish != "stop":
        return None
    return gen.tools.calls(text, f"{ident('call', gen)}_{index}")


def release(
    gen: Generation, pieces: list[Piece], piece: Piece, spoke: set[int],
    chunk: Callable[..., bytes],
) -> tuple[list[bytes], Piece | None]:  # fmt: skip
    """A held choice's new ``piece``: the chunks its words known by now make, and, when all it
    holds is words, all of it joined, to stream as such (``None``: some is still held; the
    calls or the rest go whole once the choice ends)."""
    pieces.append(piece)
    ready = words_ready(gen, pieces, piece.index in spoke)
    if ready:
        spoke.add(piece.index)
    if ready == len(pieces):
        whole = joined(pieces)
        pieces.clear()
        return [], whole
    events = []
    if ready:
        said = joined(pieces[:ready])
        events.append(chunk(said, Delta(content=said.text)))
    del pieces[:ready]
    if piece.finish_reason is not None:  # joined once, when it is whole
        events += held_end(gen, joined(pieces), chunk)
    return events, None


def words_ready(gen: Generation, pieces: list[Piece], spoke: bool) -> int:
    """How many of a choice's held pieces are surely its words, to send now (``spoke``: some
    were sent before)."""
    assert gen.tools is not None
    sendable = gen.tools.sendable("".join(p.text for p in pieces), spoke)
    ready = taken = 0
    for piece in pieces if sendable else ():
        taken += len(piece.text)
        if taken > sendable:
            break
        ready += 1
    return ready


def joined(pieces: list[Piece]) -> Piece:
    """Held pieces of one choice as one."""
    last, logprobs = pieces[-1], [p.logprobs for p in pieces if p.logprobs is not None]
    return Piece(
        "".join(p.text for p in pieces), last.finish_reason, last.index,
        tuple(t for p in pieces for t in p.token_ids),
        tuple(lp for group in logprobs for lp in group) if logprobs else None, last.stop,
    )  # fmt: skip


def held_end(gen: Generation, answer: Piece, chunk: Callable[..., bytes]) -> list[bytes]:
    """A held choice's finished ``answer`` (its pieces joined) in one chunk: its calls, or its
    text, logprobs and all, if cut before they were whole; then its finish chunk."""
    if gen.tools is None or answer.finish_reason is None:
        return []
    calls = tool_calls(gen, answer.index, answer.text, answer.finish_reason)
    if calls is None:
        said = [chunk(answer, Delta(content=answer.text))] if answer.text or answer.logprobs else []
        return [*said, chunk(answer, Delta(), answer.finish_reason)]
    words = gen.tools.preface(answer.text)
    said = [chunk(Piece("", index=answer.index), Delta(content=words))] if words else []
    deltas = [ToolCallDelta(index=i, id=c.id, function=c.function) for i, c in enumerate(calls)]
    finish = gen.tools.finish_reason
    return [*said, chunk(answer, Delta(tool_calls=deltas)), chunk(answer, Delta(), finish)]
