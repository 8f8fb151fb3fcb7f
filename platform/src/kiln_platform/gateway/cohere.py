"""Cohere's embed API (``POST /v2/embed``, ``ClientV2.embed``; ``/v1/embed``, ``Client.embed``)
on an embeddings model, as ``/v1/embeddings`` runs it (``services.encode``).

``input_type`` picks the model's prompt of that use, if it has one (``search_query``: its
``query`` prompt; ``search_document``: ``document`` or ``passage``; ``classification``,
``clustering``: so named), as sentence-transformers' ``prompt_name`` would; else the model's
default prompt. ``truncate`` ``END`` (the default) keeps a text's first tokens, ``START`` its
last, ``NONE`` refuses a text longer than the model's context; ``max_tokens`` bounds each text
from the same side (``END`` if ``NONE``). ``embedding_types``: ``float``, and ``binary`` /
``ubinary`` (each dimension's sign, 8 to a byte, as sentence-transformers'
``quantize_embeddings`` packs them: ``ubinary`` the bytes, ``binary`` each less 128). ``int8``,
``uint8`` and ``base64`` (a model's own calibration, and a format Cohere does not document) are
400s, as are images.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import msgspec
import numpy as np

from kiln_platform.errors import BadRequest
from kiln_platform.gateway import services

if TYPE_CHECKING:
    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln

Kind = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
SERVED = ("float", "binary", "ubinary")
PROMPTS = {
    "search_query": ("query",), "search_document": ("document", "passage"),
    "classification": ("classification",), "clustering": ("clustering",),
}  # fmt: skip
"""The prompt names (sentence-transformers') each ``input_type`` takes, the first the model has."""


class Content(msgspec.Struct, kw_only=True):
    """One part of an ``inputs`` item."""

    type: str
    text: str | None = None


class Input(msgspec.Struct, kw_only=True):
    """An ``inputs`` item (v2): its text parts, embedded as one text."""

    content: list[Content]


class EmbedRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v2/embed`` (and ``/v1/embed``)."""

    model: str
    texts: list[str] | None = None
    inputs: list[Input] | None = None
    images: list[Any] | None = None
    input_type: Literal[
        "search_document", "search_query", "classification", "clustering", "image"
    ] | None = None  # fmt: skip
    embedding_types: list[Kind] | None = None
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: int | None = None
    output_dimension: int | None = None
    priority: int | None = None
    """Cohere's priority under load: accepted (``x-kiln-priority`` sets a request's class)."""


class EmbedResponse(msgspec.Struct, kw_only=True):
    """Cohere's ``embeddings_by_type`` answer (``embeddings_floats``: ``/v1`` without
    ``embedding_types``, a list of float vectors)."""

    id: str
    embeddings: dict[str, list[list[Any]]] | list[list[float]]
    texts: list[str]
    meta: dict[str, Any]
    response_type: str = "embeddings_by_type"


def _texts(request: EmbedRequest) -> tuple[list[str], str]:
    """The texts to embed and the field that holds them (images are a 400)."""
    if request.images or request.input_type == "image":
        param = "images" if request.images else "input_type"
        raise BadRequest("Kiln embeds text only.", param=param)
    if (request.texts is None) == (request.inputs is None):
        raise BadRequest("Give one of 'texts' and 'inputs'.", param="texts")
    if request.texts is not None:
        return request.texts, "texts"
    texts = []
    for i, item in enumerate(request.inputs or []):
        for j, part in enumerate(item.content):
            if part.type != "text" or part.text is None:
                where = f"inputs[{i}].content[{j}]"
                raise BadRequest(f"'{where}' is not text; Kiln embeds text only.", param=where)
        texts.append("\n".join(part.text or "" for part in item.content))
    return texts, "inputs"


def _kinds(request: EmbedRequest, *, v1: bool) -> list[str]:
    kinds = list(dict.fromkeys(request.embedding_types or ([] if v1 else ["float"])))
    for i, kind in enumerate(kinds):
        if kind not in SERVED:
            raise BadRequest(f"'embedding_types[{i}]' cannot be {kind!r}; Kiln serves "
                             f"{', '.join(SERVED)}.", param=f"embedding_types[{i}]")  # fmt: skip
    return kinds


async def embed(
    kiln: Kiln, admission: Admission, request: EmbedRequest, *, v1: bool
) -> EmbedResponse:
    """Serve ``POST /v2/embed`` (``v1``: ``/v1/embed``, whose default answer is float vectors
    alone); its admission records the usage under ``embeddings``."""
    texts, field = _texts(request)
    most = services.max_inputs(kiln.settings)
    if not 0 < len(texts) <= most:
        raise BadRequest(f"'{field}' takes 1 to {most} texts.", param=field)
    kinds = _kinds(request, v1=v1)
    if request.max_tokens is not None and request.max_tokens < 1:
        raise BadRequest("'max_tokens' must be 1 or more.", param="max_tokens")
    tenant = str(admission.principal.tenant_id)
    version = await kiln.resolver.resolve(request.model, tenant)
    prompts = version.manifest.prompts
    named = next((n for n in PROMPTS.get(request.input_type or "", ()) if n in prompts), None)
    keep = None if request.truncate == "NONE" else -1
    try:
        done = await services.encode(
            kiln, admission, request.model, texts, endpoint="embeddings", prompt_name=named,
            truncate=request.max_tokens or keep, dimensions=request.output_dimension,
            names=[f"{field}[{i}]" for i in range(len(texts))],
            side="left" if request.truncate == "START" else "right",
        )  # fmt: skip
    except BadRequest as exc:
        if exc.param == "truncate_prompt_tokens":
            raise BadRequest(exc.message.replace("truncate_prompt_tokens", "max_tokens"),
                             param="max_tokens") from None  # fmt: skip
        if exc.param == "dimensions":
            raise BadRequest(exc.message.replace("'dimensions'", "'output_dimension'"),
                             param="output_dimension") from None  # fmt: skip
        raise
    meta = {"api_version": {"version": "1" if v1 else "2"},
            "billed_units": {"input_tokens": done.tokens}}  # fmt: skip
    ident = f"embed-{admission.request_id.removeprefix('req_')}"
    if not kinds:
        vectors = done.vectors.tolist()
        return EmbedResponse(id=ident, embeddings=vectors, texts=texts, meta=meta,
                             response_type="embeddings_floats")  # fmt: skip
    typed = {kind: _typed(done.vectors, kind) for kind in kinds}
    return EmbedResponse(id=ident, embeddings=typed, texts=texts, meta=meta)


def _typed(vectors: np.ndarray, kind: str) -> list[list[Any]]:
    """The vectors as ``kind``: floats, or their signs packed 8 to a byte."""
    if kind == "float":
        rows: list[list[Any]] = vectors.tolist()
        return rows
    signs = np.packbits(vectors > 0, axis=-1)
    typed: list[list[Any]] = (signs if kind == "ubinary" else signs.astype(np.int16) - 128).tolist()
    return typed
