"""OIP's gRPC messages as the REST path's request and tensors: raw or typed contents, checked
as REST's binary inputs are, each refusal naming what is wrong; the descriptor is the .proto's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kiln_platform.errors import BadRequest
from kiln_platform.gateway import oip_grpc_codec as codec
from kiln_runtimes import tensor_bytes
from kiln_runtimes.protocol import InferResult, Tensor

GATEWAY = Path(codec.__file__).parent
Request = codec.message("ModelInferRequest")
Contents = codec.message("InferTensorContents")


def _input(name: str, datatype: str, shape: list[int], **contents: Any) -> Any:
    typed = Contents(**contents) if contents else None
    return Request.InferInputTensor(name=name, datatype=datatype, shape=shape, contents=typed)


def test_the_descriptor_is_the_protos(tmp_path: Path) -> None:
    """``make proto`` was run after the last change to ``predict_v2.proto``."""
    made = tmp_path / "made.binpb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{GATEWAY}",
                    f"--descriptor_set_out={made}", "predict_v2.proto"], check=True)  # fmt: skip
    assert made.read_bytes() == (GATEWAY / "predict_v2.binpb").read_bytes()


def test_raw_and_typed_contents_give_the_same_tensors() -> None:
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    texts = [b"a", "ü".encode()]
    raw = Request(
        model_name="m", id="r1", inputs=[_input("x", "INT32", [2, 3]), _input("t", "BYTES", [2])],
        raw_input_contents=[x.tobytes(), tensor_bytes.pack(texts)],
        parameters={"timeout": codec.message("InferParameter")(int64_param=5000)},
    )  # fmt: skip
    typed = Request(model_name="m", inputs=[
        _input("x", "INT32", [2, 3], int_contents=x.ravel().tolist()),
        _input("t", "BYTES", [2], bytes_contents=texts),
    ], outputs=[Request.InferRequestedOutputTensor(name="y")])  # fmt: skip
    (request, from_raw), (asked, from_typed) = codec.request_of(raw), codec.request_of(typed)
    assert from_raw == from_typed
    assert from_raw[0] == Tensor(name="x", datatype="INT32", shape=[2, 3], data=x.tobytes())
    assert (request.id, request.parameters, request.outputs) == ("r1", {"timeout": 5000}, None)
    assert asked.id is None
    assert [o.name for o in asked.outputs or []] == ["y"]


@pytest.mark.parametrize(
    ("inputs", "raw", "said"),
    [
        ([_input("x", "FP32", [2]), _input("y", "FP32", [1])], [b"\0" * 8],
         "raw_input_contents has 1 entries for 2 inputs"),
        ([_input("x", "FP32", [2])], [b"\0" * 4], r"'x': raw_input_contents\[0\] holds 4 bytes"),
        ([_input("x", "FP32", [3], fp32_contents=[1, 2])], [],
         r"'x': 2 values in contents.fp32_contents do not fill shape \[3\]"),
        ([_input("x", "INT8", [1], int_contents=[300])], [], "out of INT8's range"),
        ([_input("x", "FP16", [1], fp32_contents=[1])], [], "FP16 data goes in raw_input_contents"),
        ([_input("x", "STRING", [1])], [b"x"], "STRING is not supported"),
        ([_input("t", "BYTES", [1])], [b"\x01\0\0\0\xff"], "'t'.*UTF-8"),
    ],
)  # fmt: skip
def test_bad_inputs_are_refused_naming_them(inputs: list[Any], raw: list[bytes], said: str) -> None:
    with pytest.raises(BadRequest, match=said):
        codec.request_of(Request(model_name="m", inputs=inputs, raw_input_contents=raw))


def test_every_output_is_raw_in_the_results_order() -> None:
    y = np.ones((1, 2), np.float32)
    result = InferResult(request_id="req_1", queue_ms=0, compute_ms=0, outputs=[
        Tensor(name="y", datatype="FP32", shape=[1, 2], data=y.tobytes()),
        Tensor(name="t", datatype="BYTES", shape=[1], data=tensor_bytes.pack(["ok"])),
    ])  # fmt: skip
    request, _ = codec.request_of(Request(model_name="m", id="q"))
    reply = codec.message("ModelInferResponse").FromString(
        codec.response_of(request, result, "m", "3").SerializeToString()
    )
    assert (reply.model_name, reply.model_version, reply.id) == ("m", "3", "q")
    assert [(o.name, o.datatype, list(o.shape)) for o in reply.outputs] == [
        ("y", "FP32", [1, 2]), ("t", "BYTES", [1])
    ]  # fmt: skip
    assert reply.raw_output_contents == [y.tobytes(), tensor_bytes.pack(["ok"])]
