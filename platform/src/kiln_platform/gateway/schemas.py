"""OpenAI-compatible request and response shapes (msgspec)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class EmbeddingsRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/embeddings``; ``input`` is validated in the service (str, list of str or ids)."""

    model: str
    input: str | list[Any]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None
    """vLLM's: an input longer than this many tokens (its special tokens counted) keeps its
    last ones (-1: the model's context); ``None``: a longer input than the context is a 400."""
    prompt_name: str | None = None
    """Text embeddings Inference's: the model's prompt (``config_sentence_transformers.json``)
    each text is prefixed with; ``None``: its default prompt, if it has one."""


class Embedding(msgspec.Struct, kw_only=True):
    """One vector: a list of floats, or base64 of little-endian float32."""

    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingsUsage(msgspec.Struct, kw_only=True):
    """Token counts of an embeddings request."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(msgspec.Struct, kw_only=True):
    """``POST /v1/embeddings`` response."""

    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage
    object: str = "list"


class ModelCard(msgspec.Struct, kw_only=True):
    """One entry of ``GET /v1/models``."""

    id: str
    created: int
    owned_by: str = "kiln"
    object: str = "model"
    parent: str | msgspec.UnsetType = msgspec.UNSET
    """The base model of a LoRA adapter (vLLM's field); absent for a base model."""
    max_model_len: int | msgspec.UnsetType = msgspec.UNSET
    """Tokens a request may use, prompt and answer (vLLM's field: clients size prompts by it)."""


class ModelList(msgspec.Struct, kw_only=True):
    """``GET /v1/models``."""

    data: list[ModelCard]
    object: str = "list"


class ErrorBody(msgspec.Struct, kw_only=True, omit_defaults=False):
    """The OpenAI error object."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct, kw_only=True):
    """``{"error": {...}}``."""

    error: ErrorBody
