"""OIP v2 bodies: JSON tensors, the binary tensor data extension, and their errors."""

from __future__ import annotations

import json
from collections.abc import Mapping

import msgspec
import numpy as np
import pytest

from kiln_platform.errors import BadRequest
from kiln_platform.gateway import oip_codec
from kiln_runtimes.protocol import InferResult, Tensor


def binary_body(header: Mapping[str, object], *buffers: bytes) -> tuple[bytes, str]:
    text = json.dumps(header).encode()
    return text + b"".join(buffers), str(len(text))


def test_parses_json_tensors_flat_or_nested() -> None:
    body = {
        "inputs": [
            {"name": "a", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]},
            {"name": "b", "shape": [3], "datatype": "INT64", "data": [1, 2, 3]},
        ]
    }
    _, tensors = oip_codec.parse(json.dumps(body).encode(), None)
    assert np.frombuffer(tensors[0].data, "<f4").tolist() == [1, 2, 3, 4]
    assert np.frombuffer(tensors[1].data, "<i8").tolist() == [1, 2, 3]


def test_parses_binary_tensor_data_in_input_order() -> None:
    a, b = np.arange(4, dtype="<f4"), np.arange(3, dtype="<i4")
    header = {
        "inputs": [
            {"name": "a", "shape": [4], "datatype": "FP32",
             "parameters": {"binary_data_size": a.nbytes}},
            {"name": "b", "shape": [3], "datatype": "INT32",
             "parameters": {"binary_data_size": b.nbytes}},
        ]
    }  # fmt: skip
    body, length = binary_body(header, a.tobytes(), b.tobytes())
    _, tensors = oip_codec.parse(body, length)
    assert tensors[0].data == a.tobytes()
    assert tensors[1].data == b.tobytes()


@pytest.mark.parametrize(
    ("body", "length", "message"),
    [
        (b"{", None, "invalid inference request"),
        (b'{"inputs": [{"name": "a", "shape": [2], "datatype": "BF16", "data": ["x", "y"]}]}',
         None, "not supported"),
        (b'{"inputs": [{"name": "a", "shape": [3], "datatype": "FP32", "data": [1, 2]}]}',
         None, "do not fill"),
        (b'{"inputs": [{"name": "a", "shape": [1], "datatype": "FP32"}]}', None, "neither"),
        (b'{"inputs": []}', "999", "does not fit"),
        (b'{"inputs": []}xx', "14", "belong to no input"),
        (b'{"inputs": [{"name": "a", "shape": [2], "datatype": "INT32", "data": [1, 1.5]}]}',
         None, "not all INT32 values"),  # numpy alone would truncate it to 1
        (b'{"inputs": [{"name": "a", "shape": [1], "datatype": "BOOL", "data": [2]}]}',
         None, "not all BOOL values"),
        (b'{"inputs": [{"name": "a", "shape": [1], "datatype": "UINT8", "data": [256]}]}',
         None, "not all UINT8 values"),
        (b'{"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": ["x"]}]}',
         None, "not all FP32 values"),
        (b'{"inputs": [{"name": "a", "shape": [2], "datatype": "FP32", "data": [1, 1e39]}]}',
         None, "out of FP32's range"),  # else infinite
        (b'{"inputs": [{"name": "a", "shape": [1], "datatype": "FP16", "data": [70000]}]}',
         None, "out of FP16's range"),
    ],
)  # fmt: skip
def test_rejects_malformed_requests(body: bytes, length: str | None, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        oip_codec.parse(body, length)


def test_takes_what_each_datatype_holds() -> None:
    body = {
        "inputs": [
            {"name": "a", "shape": [2], "datatype": "FP16", "data": [1, 2.5]},
            {"name": "b", "shape": [2], "datatype": "BOOL", "data": [True, False]},
            {"name": "c", "shape": [1], "datatype": "UINT64", "data": [2**64 - 1]},
            {"name": "d", "shape": [0, 2], "datatype": "INT32", "data": []},
        ]
    }
    _, tensors = oip_codec.parse(json.dumps(body).encode(), None)
    assert np.frombuffer(tensors[0].data, "<f2").tolist() == [1, 2.5]
    assert np.frombuffer(tensors[1].data, "|b1").tolist() == [True, False]
    assert np.frombuffer(tensors[2].data, "<u8").tolist() == [2**64 - 1]
    assert tensors[3].data == b""


def result() -> InferResult:
    y = np.array([[1.5, 2.5]], dtype="<f4")
    return InferResult(
        request_id="r", queue_ms=0, compute_ms=0,
        outputs=[Tensor(name="y", datatype="FP32", shape=[1, 2], data=y.tobytes())],
    )  # fmt: skip


def test_encodes_json_outputs_by_default() -> None:
    request, _ = oip_codec.parse(b'{"id": "7", "inputs": []}', None)
    body, headers = oip_codec.encode(request, result(), "m", "1")
    assert headers == {"content-type": "application/json"}
    decoded = msgspec.json.decode(body)
    assert decoded["id"] == "7"
    assert decoded["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [1, 2],
                                   "data": [1.5, 2.5]}]  # fmt: skip


def test_encodes_binary_outputs_after_the_json_header() -> None:
    request, _ = oip_codec.parse(
        b'{"inputs": [], "parameters": {"binary_data_output": true}}', None
    )
    body, headers = oip_codec.encode(request, result(), "m", "1")
    size = int(headers[oip_codec.HEADER_LENGTH])
    header = msgspec.json.decode(body[:size])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 8}
    assert np.frombuffer(body[size:], "<f4").tolist() == [1.5, 2.5]


def test_timeout_parameter_is_microseconds() -> None:
    request, _ = oip_codec.parse(b'{"inputs": [], "parameters": {"timeout": 250000}}', None)
    assert oip_codec.timeout_ms(request, 60) == 250
    plain, _ = oip_codec.parse(b'{"inputs": []}', None)
    assert oip_codec.timeout_ms(plain, 60) == 60000


def test_bytes_tensors_as_json_strings_or_length_prefixed_binary() -> None:
    """Triton's forms: strings in JSON (nested or flat), each element's 4-byte little-endian
    length then its bytes in binary; both come out as the same wire bytes."""
    texts = ["spam", "ünï", ""]
    packed = b"".join(len(t.encode()).to_bytes(4, "little") + t.encode() for t in texts)
    as_json = {"inputs": [{"name": "t", "shape": [1, 3], "datatype": "BYTES", "data": [texts]}]}
    _, from_json = oip_codec.parse(json.dumps(as_json).encode(), None)
    header = {"inputs": [{"name": "t", "shape": [1, 3], "datatype": "BYTES",
                          "parameters": {"binary_data_size": len(packed)}}]}  # fmt: skip
    _, from_binary = oip_codec.parse(*binary_body(header, packed))
    assert from_json[0].data == from_binary[0].data == packed
    out = InferResult(request_id="r", queue_ms=0.0, compute_ms=0.0, outputs=[
        Tensor(name="t", datatype="BYTES", shape=[1, 3], data=packed)])  # fmt: skip
    request, _ = oip_codec.parse(b'{"inputs": []}', None)
    body, _ = oip_codec.encode(request, out, "m", "1")
    assert msgspec.json.decode(body)["outputs"][0]["data"] == texts


@pytest.mark.parametrize(
    ("data", "binary", "message"),
    [
        (["a", 1, "c"], None, "not all BYTES values"),
        (["a", "b"], None, "2 values do not fill shape [3]"),
        (None, b"\x01\x00\x00\x00a", "holds 1 elements, not 3"),
        (None, b"\x09\x00\x00\x00ab", "element 0 runs past the end"),
        (None, b"\x01\x00\x00\x00a" * 3 + b"!", "1 bytes past its 3 elements"),
        (None, b"\x01\x00\x00\x00\xff" * 3, "element 0 is not UTF-8 text"),
    ],
)
def test_malformed_bytes_tensors_say_what_is_wrong(
    data: list[object] | None, binary: bytes | None, message: str
) -> None:
    item: dict[str, object] = {"name": "t", "shape": [3], "datatype": "BYTES"}
    if binary is None:
        item["data"] = data
        args: tuple[bytes, str | None] = (json.dumps({"inputs": [item]}).encode(), None)
    else:
        item["parameters"] = {"binary_data_size": len(binary)}
        args = binary_body({"inputs": [item]}, binary)
    with pytest.raises(BadRequest) as refused:
        oip_codec.parse(*args)
    assert "'t'" in str(refused.value)
    assert message in str(refused.value)
