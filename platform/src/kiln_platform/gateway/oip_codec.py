"""OIP v2 bodies <-> wire tensors: JSON tensors and the binary tensor data extension (pure)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from kiln_platform.errors import BadRequest
from kiln_platform.gateway.oip_schemas import InferOutput, InferRequestBody, InferResponseBody
from kiln_runtimes import tensor_bytes
from kiln_runtimes.protocol import DATATYPES, Tensor
from kiln_runtimes.tensor_bytes import BYTES

if TYPE_CHECKING:
    from kiln_platform.gateway.oip_schemas import InferInput
    from kiln_runtimes.protocol import InferResult

HEADER_LENGTH = "inference-header-content-length"
_decoder = msgspec.json.Decoder(InferRequestBody)


def parse(body: bytes, header_length: str | None) -> tuple[InferRequestBody, list[Tensor]]:
    """Decode a request body (JSON, or JSON header + binary buffers) into wire tensors."""
    if header_length is not None:
        try:
            size = int(header_length)
        except ValueError:
            raise BadRequest(f"{HEADER_LENGTH} must be an integer") from None
        if not 0 < size <= len(body):
            raise BadRequest(f"{HEADER_LENGTH} {size} does not fit a {len(body)}-byte body")
        header, binary = body[:size], memoryview(body)[size:]
    else:
        header, binary = body, memoryview(b"")
    try:
        request = _decoder.decode(header)
    except msgspec.DecodeError as exc:
        raise BadRequest(f"invalid inference request: {exc}") from None
    tensors, offset = [], 0
    for item in request.inputs:
        data, offset = _input(item, binary, offset)
        tensors.append(Tensor(name=item.name, datatype=item.datatype, shape=item.shape, data=data))
    if offset != len(binary):
        raise BadRequest(f"{len(binary) - offset} bytes of binary data belong to no input")
    return request, tensors


def binary_tensor(item: InferInput, data: bytes) -> Tensor:
    """One input from binary data of its own (gRPC's raw contents), checked as the binary
    extension's."""
    sized = msgspec.structs.replace(item, parameters={"binary_data_size": len(data)})
    checked, _ = _input(sized, memoryview(data), 0)
    return Tensor(name=item.name, datatype=item.datatype, shape=item.shape, data=checked)


def _input(item: InferInput, binary: memoryview, offset: int) -> tuple[bytes, int]:
    """One input's bytes (from its JSON ``data`` or the binary data from ``offset``) and where
    the next input's binary data starts."""
    if item.datatype != BYTES and item.datatype not in DATATYPES:
        raise BadRequest(f"input {item.name!r}: datatype {item.datatype} is not supported")
    if any(d < 0 for d in item.shape):
        raise BadRequest(f"input {item.name!r} has a negative dimension")
    binary_size = (item.parameters or {}).get("binary_data_size")
    if binary_size is not None:
        size = int(binary_size)
        if offset + size > len(binary) or not _fits(item, binary[offset : offset + size]):
            raise BadRequest(f"input {item.name!r}: binary_data_size {size} does not fit")
        return bytes(binary[offset : offset + size]), offset + size
    if item.data is not None:
        return _from_json(item.data, item.shape, item.name, item.datatype), offset
    raise BadRequest(f"input {item.name!r} has neither data nor binary_data_size")


def _fits(item: InferInput, data: memoryview) -> bool:
    """Binary data is the input's shape of its datatype (``BYTES``: of whole UTF-8 elements)."""
    count = math.prod(item.shape)
    if item.datatype != BYTES:
        return len(data) == count * np.dtype(DATATYPES[item.datatype]).itemsize
    try:
        tensor_bytes.unpack(data, count)
    except ValueError as exc:
        raise BadRequest(f"input {item.name!r}: its BYTES data {exc}") from None
    return True


TAKES = {"b": "b", "i": "iu", "u": "iu"}
"""The JSON values (as numpy infers them) an integer or BOOL input takes: numpy would truncate
``1.5`` to 1 and read 2 as true, where Triton refuses them."""


def _from_json(data: list[Any], shape: list[int], name: str, datatype: str) -> bytes:
    """``data`` as the input's bytes; a 400 for a value of another type or out of its range
    (a float past FP16's or FP32's largest would become infinite)."""
    if datatype == BYTES:
        return _texts(data, shape, name)
    dtype = np.dtype(DATATYPES[datatype])
    try:
        with np.errstate(over="ignore"):  # an overflow is found below, as infinities
            array = np.asarray(data, dtype=dtype)
        given = np.asarray(data) if dtype.kind in TAKES and array.size else None
        exact = given is None or given.dtype.kind in TAKES[dtype.kind]
    except (ValueError, TypeError, OverflowError):
        exact = False
    if not exact:
        raise BadRequest(f"input {name!r}: data is not all {datatype} values")
    if dtype.kind == "f" and np.isinf(array).any():
        raise BadRequest(f"input {name!r}: data holds values out of {datatype}'s range")
    if array.size != math.prod(shape):
        raise BadRequest(f"input {name!r}: {array.size} values do not fill shape {shape}")
    return array.tobytes()


def _texts(data: list[Any], shape: list[int], name: str) -> bytes:
    """A ``BYTES`` input's JSON strings (a flat or nested list), in the wire form."""
    flat: list[Any] = []
    pending: list[Any] = [data]
    while pending:
        value = pending.pop()
        if isinstance(value, list):
            pending.extend(reversed(value))
        else:
            flat.append(value)
    if not all(isinstance(v, str) for v in flat):
        raise BadRequest(f"input {name!r}: data is not all BYTES values (JSON strings)")
    if len(flat) != math.prod(shape):
        raise BadRequest(f"input {name!r}: {len(flat)} values do not fill shape {shape}")
    return tensor_bytes.pack(flat)


def encode(
    request: InferRequestBody, result: InferResult, model: str, version: str
) -> tuple[bytes, dict[str, str]]:
    """The response body and headers; binary outputs go after the JSON header when asked for."""
    default_binary = bool((request.parameters or {}).get("binary_data_output", False))
    wanted = {o.name: (o.parameters or {}) for o in request.outputs or []}
    outputs, buffers = [], []
    for tensor in result.outputs:
        params = wanted.get(tensor.name, {})
        if params.get("binary_data", default_binary):
            outputs.append(
                InferOutput(
                    name=tensor.name, datatype=tensor.datatype, shape=tensor.shape,
                    parameters={"binary_data_size": len(tensor.data)},
                )
            )  # fmt: skip
            buffers.append(tensor.data)
        else:
            outputs.append(
                InferOutput(
                    name=tensor.name, datatype=tensor.datatype, shape=tensor.shape,
                    data=values(tensor),
                )
            )  # fmt: skip
    header = msgspec.json.encode(
        InferResponseBody(model_name=model, model_version=version, outputs=outputs, id=request.id)
    )
    if not buffers:
        return header, {"content-type": "application/json"}
    headers = {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(header))}
    return b"".join([header, *buffers]), headers


def values(tensor: Tensor) -> list[Any]:
    """An output's elements as JSON values (``BYTES``: strings), flat in row-major order."""
    array = (tensor_bytes.unpack(tensor.data, math.prod(tensor.shape))
             if tensor.datatype == BYTES
             else np.frombuffer(tensor.data, dtype=DATATYPES[tensor.datatype]))  # fmt: skip
    values: list[Any] = array.tolist()
    return values


def output_names(request: InferRequestBody) -> list[str] | None:
    """The outputs the client asked for (None: all of them)."""
    return [o.name for o in request.outputs] if request.outputs else None


def timeout_ms(request: InferRequestBody, default_s: float) -> int:
    """The request's deadline: Triton's ``timeout`` parameter (microseconds) or the default."""
    micros = (request.parameters or {}).get("timeout")
    if isinstance(micros, int) and micros > 0:
        return max(1, micros // 1000)
    return int(default_s * 1000)
