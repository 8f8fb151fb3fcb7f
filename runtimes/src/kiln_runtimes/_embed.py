"""The embeddings path: validate an ``EmbedRequest``, batch it, answer with an ``EmbedResult``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kiln_runtimes._errors import BadRequest
from kiln_runtimes._spans import ticket_spans
from kiln_runtimes.protocol import EmbedRequest, EmbedResult

if TYPE_CHECKING:
    from kiln_runtimes.batcher import Batcher

MAX_TOKEN_ID = 2**31 - 1


def validate(request: EmbedRequest, context_length: int, max_inputs: int) -> None:
    """Raise ``BadRequest`` unless every input can be embedded by this model."""
    if not request.input_ids:
        raise BadRequest("input_ids is empty")
    if len(request.input_ids) > max_inputs:
        count = len(request.input_ids)
        raise BadRequest(f"{count} inputs exceed the worker's queue of {max_inputs}")
    for n, sequence in enumerate(request.input_ids):
        if not sequence:
            raise BadRequest(f"input {n} is empty")
        if len(sequence) > context_length:
            raise BadRequest(
                f"input {n} has {len(sequence)} tokens; the model's context is {context_length}"
            )
        if min(sequence) < 0 or max(sequence) > MAX_TOKEN_ID:
            raise BadRequest(f"input {n} has a token id outside [0, {MAX_TOKEN_ID}]")


async def embed(batcher: Batcher, request: EmbedRequest) -> EmbedResult:
    """Embed a validated request's inputs through the batcher."""
    budget = None if request.timeout_ms is None else request.timeout_ms / 1000
    ticket = await batcher.submit(
        request.request_id, request.input_ids, budget, express=request.express
    )
    ticket_spans(ticket)
    rows = ticket.embeddings().astype("<f4", copy=False)
    started = ticket.started_at if ticket.started_at is not None else ticket.enqueued_at
    return EmbedResult(
        request_id=request.request_id,
        dimensions=rows.shape[1],
        data=np.ascontiguousarray(rows).tobytes(),
        queue_ms=(started - ticket.enqueued_at) * 1000,
        compute_ms=ticket.compute_s * 1000,
    )
