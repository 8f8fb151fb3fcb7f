"""Open Inference Protocol v2: health, metadata, readiness and inference for tensor models."""

from __future__ import annotations

import dataclasses
import time
from importlib import metadata
from typing import TYPE_CHECKING

import msgspec

from kiln_platform.billing.ledger import usage_of
from kiln_platform.billing.pricing import Quantities
from kiln_platform.db import migrate
from kiln_platform.errors import BadRequest
from kiln_platform.gateway import oip_codec
from kiln_platform.gateway.oip_schemas import (
    ConfigTensor,
    DynamicBatching,
    IndexedModel,
    IndexRequest,
    MetadataTensor,
    ModelConfig,
    ModelMetadata,
    ServerMetadata,
)
from kiln_runtimes.protocol import InferRequest

if TYPE_CHECKING:
    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln
    from kiln_platform.gateway.oip_schemas import InferRequestBody
    from kiln_platform.registry.services import ResolvedVersion
    from kiln_platform.settings import Settings
    from kiln_runtimes.protocol import InferResult, Tensor, TensorSpec

EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics"]
"""(The model repository extension is served in part: its index, not load and unload.)"""
TASKS = ("tensor", "generate")
"""The tasks ``/v2`` serves: tensor models, and LLMs through their text tensors (``oip_llm``)."""
SCALED_TO_ZERO = "no worker is up (scaled to zero): the next request starts one"


def server_metadata() -> ServerMetadata:
    """``GET /v2``."""
    return ServerMetadata(
        name="kiln", version=metadata.version("kiln-platform"), extensions=EXTENSIONS
    )


async def server_ready(kiln: Kiln) -> bool:
    """Ready to serve: the database is reachable and migrated, or unreachable within the outage
    bound (degraded: cached keys served, usage spooled; ``/readyz`` says which)."""
    try:
        return await migrate.is_current(kiln.db.engine) or kiln.ledger.degraded()
    except Exception:  # the database unreachable: ready only within the outage bound
        return kiln.ledger.degraded()


async def resolve(kiln: Kiln, name: str, version: str | None, sticky: str = "") -> ResolvedVersion:
    """The version of a tensor model or an LLM (``oip_llm``) that serves: the one the path
    names (a version, an alias, ``stable`` or ``canary``; any but a retired one), else what the
    plain name gives ``sticky`` (a tenant id: its operator pin, the route's sticky choice, or
    the default version)."""
    address = name if version is None else f"{name}@{version}"
    resolved = await kiln.resolver.resolve(address, sticky)
    if resolved.manifest.task not in TASKS:
        raise BadRequest(f"The model `{name}` is not a tensor model or an LLM; use /v1.")
    return resolved


def model_metadata(version: ResolvedVersion) -> ModelMetadata:
    """``GET /v2/models/{name}[/versions/{v}]``."""
    m = version.manifest
    return ModelMetadata(
        name=version.model,
        versions=[version.version],
        platform="onnxruntime_onnx",
        inputs=[MetadataTensor(name=s.name, datatype=s.datatype, shape=s.shape) for s in m.inputs],
        outputs=[
            MetadataTensor(name=s.name, datatype=s.datatype, shape=s.shape) for s in m.outputs
        ],
    )


def model_config(version: ResolvedVersion, settings: Settings) -> ModelConfig:
    """``GET /v2/models/{name}[/versions/{v}]/config`` (Triton's extension). A batching model's
    ``max_batch_size`` is the most rows one request may carry; the engine runs up to the
    version's max batch size at a time (``preferred_batch_size``)."""
    m = version.manifest
    cut = 1 if m.batching else 0

    def tensors(specs: list[TensorSpec]) -> list[ConfigTensor]:
        return [ConfigTensor(name=s.name, data_type=_config_type(s.datatype), dims=s.shape[cut:])
                for s in specs]  # fmt: skip

    batching = None
    if m.batching:
        batch = version.engine.max_batch_size or settings.worker_max_batch_size
        delay = round(settings.worker_max_wait_ms * 1000)
        batching = DynamicBatching(preferred_batch_size=[batch], max_queue_delay_microseconds=delay)
    return ModelConfig(
        name=version.model,
        platform="onnxruntime_onnx",
        backend="onnxruntime",
        max_batch_size=settings.worker_max_queue if m.batching else 0,
        input=tensors(m.inputs),
        output=tensors(m.outputs),
        dynamic_batching=batching,
    )


def _config_type(datatype: str) -> str:
    """An OIP datatype as Triton's configuration names it (``FP32`` -> ``TYPE_FP32``)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def index_request(body: bytes) -> IndexRequest:
    """The repository index request's body: empty, or ``{"ready": bool}`` (400 else)."""
    if not body.strip():
        return IndexRequest()
    try:
        return msgspec.json.decode(body, type=IndexRequest, strict=True)
    except msgspec.DecodeError as exc:
        raise BadRequest(f"invalid repository index request: {exc}") from None


async def repository_index(kiln: Kiln, tenant: str, ready_only: bool) -> list[IndexedModel]:
    """``POST /v2/repository/index`` (Triton's model repository extension, the index only):
    the tensor models and LLMs ``tenant`` may call, as their plain names give them to it."""
    index = []
    for version in await served_models(kiln, tenant):
        ready = kiln.pools.is_ready(version.pool)
        if ready or not ready_only:
            index.append(IndexedModel(name=version.model, version=version.version,
                                      state="READY" if ready else "UNAVAILABLE",
                                      reason="" if ready else SCALED_TO_ZERO))  # fmt: skip
    return index


async def served_models(kiln: Kiln, tenant: str) -> list[ResolvedVersion]:
    """The tensor models and LLMs ``tenant`` may call, each as its plain name gives it."""
    await kiln.resolver.refresh()
    return [v for v in kiln.resolver.listed(tenant) if v.manifest.task in TASKS]


def model_ready(kiln: Kiln, version: ResolvedVersion) -> bool:
    """Whether a worker of the model is ready now (asking neither starts one nor keeps one)."""
    return kiln.pools.is_ready(version.pool)


async def run(
    kiln: Kiln,
    admission: Admission,
    version: ResolvedVersion,
    request: InferRequestBody,
    tensors: list[Tensor],
) -> InferResult:
    """Schedule and run on a worker (REST and gRPC alike); its admission records the usage.

    The deadline is Triton's ``timeout`` parameter when the client sets one, else the
    admission's.
    """
    request_id, terms = admission.request_id, admission.terms
    timeout_ms = oip_codec.timeout_ms(request, terms.timeout_s or kiln.settings.request_timeout_s)
    terms = dataclasses.replace(terms, timeout_s=timeout_ms / 1000)
    batched = version.manifest.batching and tensors and tensors[0].shape
    rows = tensors[0].shape[0] if batched else 1
    await admission.hold(version, Quantities(items=rows))
    message = InferRequest(
        request_id=request_id,
        inputs=tensors,
        outputs=oip_codec.output_names(request),
        timeout_ms=timeout_ms,
    )
    usage = usage_of(admission.principal, version, request_id, "infer", items=rows)
    started = time.perf_counter()
    async with admission.dispatched(usage):
        result = await kiln.workers.infer(version.pool, message, terms, max(rows, 1))
    took_s = time.perf_counter() - started
    await admission.commit(
        dataclasses.replace(usage, queue_ms=result.queue_ms, compute_ms=result.compute_ms)
    )
    shadow = kiln.shadows.plan(version, request_id)
    if shadow is not None:  # a copy to the candidate, after the answer is in hand
        kiln.shadows.infer(shadow, message, result, max(rows, 1), took_s)
    return result
