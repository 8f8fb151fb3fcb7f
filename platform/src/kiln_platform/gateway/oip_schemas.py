"""Open Inference Protocol v2 (REST) request and response shapes (msgspec)."""

from __future__ import annotations

from typing import Any

import msgspec


class InferInput(msgspec.Struct, kw_only=True):
    """An input tensor: JSON ``data``, or ``parameters.binary_data_size`` bytes after the header."""

    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class RequestedOutput(msgspec.Struct, kw_only=True):
    """An output the client wants, optionally as binary (``parameters.binary_data``)."""

    name: str
    parameters: dict[str, Any] | None = None


class InferRequestBody(msgspec.Struct, kw_only=True):
    """``POST /v2/models/{name}[/versions/{v}]/infer``."""

    inputs: list[InferInput]
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[RequestedOutput] | None = None


class InferOutput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One output tensor in the response."""

    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class InferResponseBody(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The inference response header (followed by binary outputs, if any)."""

    model_name: str
    model_version: str
    outputs: list[InferOutput]
    id: str | None = None


class MetadataTensor(msgspec.Struct, kw_only=True):
    """A tensor in model metadata (``-1`` for a dynamic dimension)."""

    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(msgspec.Struct, kw_only=True):
    """``GET /v2/models/{name}[/versions/{v}]``."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[MetadataTensor]
    outputs: list[MetadataTensor]


class ServerMetadata(msgspec.Struct, kw_only=True):
    """``GET /v2``."""

    name: str
    version: str
    extensions: list[str]


class ConfigTensor(msgspec.Struct, kw_only=True):
    """A tensor in Triton's model configuration: a ``TYPE_*`` data type, and dims without the
    batch dimension when the model batches (``max_batch_size`` > 0)."""

    name: str
    data_type: str
    dims: list[int]


class DynamicBatching(msgspec.Struct, kw_only=True):
    """How the worker batches requests' rows: up to the engine's batch, waiting at most so long."""

    preferred_batch_size: list[int]
    max_queue_delay_microseconds: int


class TransactionPolicy(msgspec.Struct, kw_only=True):
    """Triton's ``model_transaction_policy``: ``decoupled``, a request answered by any number of
    responses (an LLM's pieces over ``ModelStreamInfer``)."""

    decoupled: bool


class ModelConfig(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``GET /v2/models/{name}[/versions/{v}]/config``: Triton's model configuration extension,
    in its JSON field names (what ``tritonclient``'s ``get_model_config`` reads)."""

    name: str
    platform: str
    backend: str
    max_batch_size: int
    input: list[ConfigTensor]
    output: list[ConfigTensor]
    dynamic_batching: DynamicBatching | None = None
    model_transaction_policy: TransactionPolicy | None = None


class IndexRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v2/repository/index``'s body (Triton's; an empty body is ``{}``)."""

    ready: bool = False
    """List only the models a worker is ready for."""


class IndexedModel(msgspec.Struct, kw_only=True):
    """A model in the repository index: ``READY`` (a worker is up) or ``UNAVAILABLE``."""

    name: str
    version: str
    state: str
    reason: str


class DurationStat(msgspec.Struct, kw_only=True):
    """A count and the nanoseconds it took in total (Triton's ``$duration_stat``)."""

    count: int = 0
    ns: int = 0


class InferenceStats(msgspec.Struct, kw_only=True):
    """Triton's ``inference_stats``: successful and failed requests, and the successes' time
    waiting in the worker's queue and computing."""

    success: DurationStat
    fail: DurationStat
    queue: DurationStat
    compute_input: DurationStat
    compute_infer: DurationStat
    compute_output: DurationStat
    cache_hit: DurationStat
    cache_miss: DurationStat


class ModelStat(msgspec.Struct, kw_only=True):
    """One model version's statistics (Triton's ``$model_stat``)."""

    name: str
    version: str
    last_inference: int
    """Milliseconds since the epoch of the last request counted (0: none)."""
    inference_count: int
    execution_count: int
    inference_stats: InferenceStats
    response_stats: dict[str, Any] = msgspec.field(default_factory=dict)
    batch_stats: list[Any] = msgspec.field(default_factory=list)
    memory_usage: list[Any] = msgspec.field(default_factory=list)


class ModelStats(msgspec.Struct, kw_only=True):
    """``GET /v2/models[/{name}[/versions/{v}]]/stats`` (Triton's statistics extension)."""

    model_stats: list[ModelStat]
