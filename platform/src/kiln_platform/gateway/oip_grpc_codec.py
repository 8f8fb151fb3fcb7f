"""OIP's gRPC messages (``inference.*``, ``predict_v2.proto``) <-> the REST path's request and
wire tensors (pure).

The messages live in a descriptor pool of their own: ``tritonclient.grpc`` defines the same
names (Triton's ``grpc_service.proto``) in protobuf's default pool, and a process may hold both.
An input's data is its ``raw_input_contents`` entry (every input's, or none) or its typed
``contents`` (no ``FP16``/``BF16``: those are raw only, as Triton has it); it is then checked
as a binary REST input is (``oip_codec.binary_tensor``). Outputs are always raw
(``raw_output_contents``), as Triton answers its own client.
"""

from __future__ import annotations

import math
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any

import grpc
import msgspec
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from kiln_platform.errors import BadRequest
from kiln_platform.gateway import oip_codec
from kiln_platform.gateway.oip_schemas import InferInput, InferRequestBody, RequestedOutput
from kiln_runtimes import tensor_bytes
from kiln_runtimes.protocol import DATATYPES
from kiln_runtimes.tensor_bytes import BYTES

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from kiln_platform.gateway.oip_schemas import (
        IndexedModel,
        InferenceStats,
        ModelConfig,
        ModelMetadata,
        ModelStats,
    )
    from kiln_runtimes.protocol import InferResult, Tensor


S = grpc.StatusCode
CODES = {
    400: S.INVALID_ARGUMENT, 401: S.UNAUTHENTICATED, 403: S.PERMISSION_DENIED, 404: S.NOT_FOUND,
    408: S.DEADLINE_EXCEEDED, 409: S.FAILED_PRECONDITION, 413: S.RESOURCE_EXHAUSTED,
    429: S.RESOURCE_EXHAUSTED, 499: S.CANCELLED, 501: S.UNIMPLEMENTED, 502: S.UNAVAILABLE,
    503: S.UNAVAILABLE, 504: S.DEADLINE_EXCEEDED,
}  # fmt: skip
"""The gRPC code of each REST status (others: ``INTERNAL``)."""


def code_of(status: int) -> grpc.StatusCode:
    """The gRPC code of a REST status."""
    return CODES.get(status, S.INTERNAL)


def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    described = (files(__package__) / "predict_v2.binpb").read_bytes()
    for file in descriptor_pb2.FileDescriptorSet.FromString(described).file:
        pool.Add(file)
    return pool


_POOL = _pool()
SERVICE = "inference.GRPCInferenceService"


@cache
def message(name: str) -> Any:
    """The message class ``inference.<name>``."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"inference.{name}"))


CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", BYTES: "bytes_contents",
}  # fmt: skip
"""The ``InferTensorContents`` field each datatype's values are in."""


def parameters(given: Any) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as plain values."""
    return {
        key: getattr(value, choice)
        for key, value in given.items()
        if (choice := value.WhichOneof("parameter_choice")) is not None
    }


def request_of(call: Message) -> tuple[InferRequestBody, list[Tensor]]:
    """A ``ModelInferRequest`` as the REST path's request and its checked input tensors."""
    given: Any = call
    raws = given.raw_input_contents
    if raws and len(raws) != len(given.inputs):
        raise BadRequest(f"raw_input_contents has {len(raws)} entries for {len(given.inputs)} "
                         "inputs: it holds every input's data or none.",
                         param="raw_input_contents")  # fmt: skip
    inputs, tensors = [], []
    for i, tensor in enumerate(given.inputs):
        item = InferInput(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        where = f"raw_input_contents[{i}]"
        data = _sized(item, raws[i], where) if raws else _contents(item, tensor)
        tensors.append(oip_codec.binary_tensor(item, data))
        inputs.append(item)
    request = InferRequestBody(
        inputs=inputs, id=given.id or None, parameters=parameters(given.parameters) or None,
        outputs=[RequestedOutput(name=o.name) for o in given.outputs] or None,
    )  # fmt: skip
    return request, tensors


def _sized(item: InferInput, data: bytes, where: str) -> bytes:
    """Raw data of the size its shape and datatype take (``BYTES``: checked by the codec)."""
    if item.datatype in DATATYPES and min(item.shape, default=0) >= 0:
        size = math.prod(item.shape) * np.dtype(DATATYPES[item.datatype]).itemsize
        if len(data) != size:
            raise BadRequest(f"input {item.name!r}: {where} holds {len(data)} bytes; shape "
                             f"{item.shape} of {item.datatype} takes {size}.")  # fmt: skip
    return data


def _contents(item: InferInput, tensor: Any) -> bytes:
    """A typed input's values (its datatype's ``contents`` field) in the wire form."""
    field = CONTENTS.get(item.datatype)
    if field is None:
        raise BadRequest(f"input {item.name!r}: {item.datatype} data goes in raw_input_contents "
                         "(contents has no field for it).")  # fmt: skip
    values = getattr(tensor.contents, field)
    if len(values) != math.prod(item.shape):
        raise BadRequest(f"input {item.name!r}: {len(values)} values in contents.{field} do "
                         f"not fill shape {item.shape}.")  # fmt: skip
    if item.datatype == BYTES:
        return tensor_bytes.pack(values)
    given = np.asarray(values)
    array = given.astype(DATATYPES[item.datatype])
    if array.dtype.kind in "iu" and not np.array_equal(array, given):
        raise BadRequest(f"input {item.name!r}: contents.{field} holds values out of "
                         f"{item.datatype}'s range.")  # fmt: skip
    return array.tobytes()


def response_of(request: InferRequestBody, result: InferResult, model: str, version: str) -> Any:
    """The ``ModelInferResponse`` of a result: every output raw, in the result's order."""
    out = message("ModelInferResponse").InferOutputTensor
    return message("ModelInferResponse")(
        model_name=model, model_version=version, id=request.id or "",
        outputs=[out(name=t.name, datatype=t.datatype, shape=t.shape) for t in result.outputs],
        raw_output_contents=[t.data for t in result.outputs],
    )  # fmt: skip


def metadata_of(described: ModelMetadata) -> Any:
    """The ``ModelMetadataResponse`` of REST's model metadata."""
    reply = message("ModelMetadataResponse")
    tensor = reply.TensorMetadata
    return reply(
        name=described.name, versions=described.versions, platform=described.platform,
        inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in described.inputs],
        outputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape)
                 for t in described.outputs],
    )  # fmt: skip


def config_of(config: ModelConfig) -> Any:
    """The ``ModelConfigResponse`` of REST's model configuration (Triton's extension)."""
    batching = config.dynamic_batching
    return message("ModelConfigResponse")(config=message("ModelConfig")(
        name=config.name, platform=config.platform, backend=config.backend,
        max_batch_size=config.max_batch_size,
        input=[message("ModelInput")(name=t.name, data_type=t.data_type, dims=t.dims)
               for t in config.input],
        output=[message("ModelOutput")(name=t.name, data_type=t.data_type, dims=t.dims)
                for t in config.output],
        dynamic_batching=batching and message("ModelDynamicBatching")(
            preferred_batch_size=batching.preferred_batch_size,
            max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
        ),
        model_transaction_policy=config.model_transaction_policy and message(
            "ModelTransactionPolicy")(decoupled=config.model_transaction_policy.decoupled),
    ))  # fmt: skip


def index_of(models: list[IndexedModel]) -> Any:
    """The ``RepositoryIndexResponse`` of REST's repository index."""
    reply = message("RepositoryIndexResponse")
    return reply(models=[reply.ModelIndex(name=m.name, version=m.version, state=m.state,
                                          reason=m.reason) for m in models])  # fmt: skip


def stats_of(stats: ModelStats) -> Any:
    """The ``ModelStatisticsResponse`` of REST's statistics (Triton's extension)."""
    duration = message("StatisticDuration")

    def timed(stat: InferenceStats) -> Any:
        return message("InferStatistics")(**{
            name: duration(count=value.count, ns=value.ns)
            for name, value in msgspec.structs.asdict(stat).items()
        })  # fmt: skip

    return message("ModelStatisticsResponse")(model_stats=[
        message("ModelStatistics")(
            name=m.name, version=m.version, last_inference=m.last_inference,
            inference_count=m.inference_count, execution_count=m.execution_count,
            inference_stats=timed(m.inference_stats),
        ) for m in stats.model_stats
    ])  # fmt: skip
