"""Triton's generate extension on an LLM: ``POST /v2/models/{name}[/versions/{v}]/generate``
(one JSON answer) and ``…/generate_stream`` (server-sent events), a text completion underneath
(``llm.prepare``; billed under ``generate``).

The body is ``text_input`` and the sampling fields, as Triton's LLM backends take them: flat
(TensorRT-LLM's ``max_tokens``, ``stop_words``, ``random_seed``…), in ``parameters``, or in
``sampling_parameters`` (vLLM's backend: a JSON string), each a ``/v1/completions`` field (a
400 naming one it does not know). The answer's ``text_output`` starts with the input unless
``exclude_input_in_output`` (vLLM's backend's default), as that backend answers.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec

from kiln_platform.errors import BadRequest, KilnError
from kiln_platform.gateway import llm
from kiln_platform.gateway.completions import collect
from kiln_platform.gateway.llm_schemas import CompletionRequest

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln
    from kiln_platform.gateway.llm import Generation

RENAMED = {"stop_words": "stop", "random_seed": "seed"}
"""TensorRT-LLM's names of completion fields."""
OWN = ("text_input", "parameters", "sampling_parameters", "exclude_input_in_output", "id")


def _fields(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields of a generate body, from wherever it puts them."""
    given = body.get("sampling_parameters")
    try:
        nested = json.loads(given) if given is not None else {}
    except (TypeError, ValueError):
        nested = None
    if not isinstance(nested, dict):
        raise BadRequest("'sampling_parameters' must be a JSON object in a string.",
                         param="sampling_parameters")  # fmt: skip
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadRequest("'parameters' must be an object.", param="parameters")
    flat = {k: v for k, v in body.items() if k not in OWN}
    fields = {RENAMED.get(k, k): v for k, v in {**nested, **parameters, **flat}.items()}
    if fields.pop("bad_words", None) not in (None, "", []):
        raise BadRequest("'bad_words' is not supported.", param="bad_words")
    if fields.get("stop") in ("", []):  # TensorRT-LLM's examples send an empty stop_words
        del fields["stop"]
    return fields


async def prepare(
    kiln: Kiln, admission: Admission, name: str, version: str | None, body: Any, *, stream: bool
) -> Generation:
    """The text completion a generate request is, prepared (``llm.prepare``)."""
    if not isinstance(body, dict) or not isinstance(body.get("text_input"), str):
        raise BadRequest("'text_input' is required (a string).", param="text_input")
    fields = _fields(body)
    fields.pop("stream", None)  # the route says
    if fields.get("n") not in (None, 1):
        raise BadRequest("'n' must be 1: a generate request has one answer.", param="n")
    model = name if version is None else f"{name}@{version}"
    echo = body.get("exclude_input_in_output") is not True
    try:
        request = msgspec.convert(
            {
                **fields,
                "model": model,
                "prompt": body["text_input"],
                "echo": echo or None,
                "stream": stream,
            },
            CompletionRequest,
        )
    except msgspec.ValidationError as exc:
        raise BadRequest(f"Invalid generate request: {exc}") from None
    try:
        gen = await llm.prepare(kiln, admission, request)
    except BadRequest as exc:
        if exc.param != "prompt":
            raise
        raise BadRequest(exc.message.replace("'prompt'", "'text_input'"), param="text_input",
                         ) from None  # fmt: skip
    gen.endpoint = "generate"
    return gen


def _answer(gen: Generation, text: str) -> dict[str, Any]:
    return {"model_name": gen.version.model, "model_version": gen.version.version,
            "text_output": text}  # fmt: skip


async def complete(gen: Generation) -> dict[str, Any]:
    """``…/generate``: the whole answer."""
    (answer,) = await collect(gen)
    return _answer(gen, gen.choices[0].echo + "".join(answer.parts))


async def stream(gen: Generation) -> AsyncGenerator[bytes, None]:
    """``…/generate_stream``: an event per piece of text (the input first, if echoed); a
    failure after the start is an event ``{"error": …}``, as Triton sends one."""
    if gen.choices[0].echo:
        yield llm.sse(_answer(gen, gen.choices[0].echo))
    try:
        async for piece in gen.pieces():
            if piece.text:
                yield llm.sse(_answer(gen, piece.text))
    except KilnError as exc:
        yield llm.sse({"error": exc.message})
