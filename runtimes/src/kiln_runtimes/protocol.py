"""The one wire contract between the gateway and runtime workers.

Every message that crosses the process boundary is a msgspec struct defined here and travels as
MessagePack over HTTP (``CONTENT_TYPE``). Streams (``/generate``) are a sequence of frames, each a
4-byte big-endian length followed by one encoded ``GenerateChunk``.

Worker endpoints:

- ``GET /health``    -> ``WorkerInfo`` (200 when ready, 503 while warming up or draining)
- ``POST /embed``    ``EmbedRequest`` -> ``EmbedResult`` | ``ErrorReply``
- ``POST /generate`` ``GenerateRequest`` -> frames of ``GenerateChunk`` | ``ErrorReply``
- ``GET /metrics``   Prometheus text format
"""

from __future__ import annotations

from typing import Literal

import msgspec

CONTENT_TYPE = "application/msgpack"
MANIFEST_NAME = "kiln.json"

Task = Literal["embeddings", "generate", "tensor"]
ErrorCode = Literal["bad_request", "overloaded", "deadline_exceeded", "draining", "internal"]
FinishReason = Literal["stop", "length", "cancelled", "error"]


class ModelManifest(msgspec.Struct, frozen=True, kw_only=True):
    """Describes a built model folder (written as ``kiln.json`` beside the model files)."""

    name: str
    task: Task
    engine: Literal["onnxruntime", "onnxruntime-genai", "tensorrt"]
    model_file: str = "model.onnx"
    tokenizer_file: str | None = "tokenizer.json"
    context_length: int = 512
    dimensions: int | None = None
    source: str = ""


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's self-description, also its readiness report."""

    model: str
    version: str
    task: Task
    ready: bool
    draining: bool
    in_flight: int
    queued: int
    free_slots: int
    max_batch_size: int


class EmbedRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Token ids of one API request's inputs (tokenized in the gateway, unpadded)."""

    request_id: str
    input_ids: list[list[int]]
    timeout_ms: int | None = None


class EmbedResult(msgspec.Struct, frozen=True, kw_only=True):
    """Float32 little-endian embeddings, ``len(input_ids) x dimensions``, row-major."""

    request_id: str
    dimensions: int
    data: bytes
    queue_ms: float
    compute_ms: float


class GenerateRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One sequence to generate from prompt token ids."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = []
    timeout_ms: int | None = None


class GenerateChunk(msgspec.Struct, frozen=True, kw_only=True):
    """New token ids for a sequence; the last chunk has ``finish_reason`` set."""

    request_id: str
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ErrorReply(msgspec.Struct, frozen=True, kw_only=True):
    """A worker-side refusal or failure; ``retry_after_s`` is set for transient ones."""

    code: ErrorCode
    message: str
    retry_after_s: float | None = None


encoder = msgspec.msgpack.Encoder()


def frame(chunk: GenerateChunk) -> bytes:
    """Encode one stream frame: 4-byte big-endian length, then the msgpack body."""
    body = encoder.encode(chunk)
    return len(body).to_bytes(4, "big") + body
