"""An LLM's tensor face, as Triton's LLM backends give theirs (vLLM's; TensorRT-LLM's
ensemble): ``…/infer`` (REST, and gRPC's ``ModelInfer``) takes a ``text_input`` BYTES tensor
and the sampling fields as one-element tensors (``max_tokens``, ``temperature``,
``stop_words``…, or vLLM's ``sampling_parameters`` JSON), and answers a ``text_output`` BYTES
tensor; gRPC's ``ModelStreamInfer`` with ``stream`` true answers a response per piece of text
(``oip_grpc_stream``). A generate request underneath (``generate.prepare``: the same fields,
names and 400s; billed under ``generate``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln_platform.errors import BadRequest
from kiln_platform.gateway import generate, oip_codec
from kiln_platform.gateway.completions import collect
from kiln_platform.gateway.oip_schemas import (
    ConfigTensor,
    MetadataTensor,
    ModelConfig,
    ModelMetadata,
    TransactionPolicy,
)
from kiln_runtimes import tensor_bytes
from kiln_runtimes.protocol import InferResult, Tensor

if TYPE_CHECKING:
    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln
    from kiln_platform.gateway.llm import Generation
    from kiln_platform.gateway.oip_schemas import InferRequestBody
    from kiln_platform.registry.services import ResolvedVersion

INPUTS = [
    MetadataTensor(name="text_input", datatype="BYTES", shape=[1]),
    MetadataTensor(name="stream", datatype="BOOL", shape=[1]),
    MetadataTensor(name="sampling_parameters", datatype="BYTES", shape=[1]),
    MetadataTensor(name="exclude_input_in_output", datatype="BOOL", shape=[1]),
]
"""vLLM's backend's inputs (TensorRT-LLM's flat sampling tensors are taken too)."""
OUTPUT = "text_output"
LISTS = ("stop_words", "bad_words")
"""The inputs whose every element is a value (the others hold one)."""


def metadata(version: ResolvedVersion) -> ModelMetadata:
    """``GET /v2/models/{name}`` of an LLM."""
    return ModelMetadata(
        name=version.model, versions=[version.version], platform="onnxruntime_onnx",
        inputs=INPUTS, outputs=[MetadataTensor(name=OUTPUT, datatype="BYTES", shape=[-1])],
    )  # fmt: skip


def config(version: ResolvedVersion) -> ModelConfig:
    """``GET /v2/models/{name}/config`` of an LLM, as Triton's vLLM backend's: no batch
    dimension (one prompt a request), decoupled (``ModelStreamInfer`` streams its pieces)."""

    def typed(t: MetadataTensor) -> ConfigTensor:
        kind = "TYPE_STRING" if t.datatype == "BYTES" else f"TYPE_{t.datatype}"
        return ConfigTensor(name=t.name, data_type=kind, dims=t.shape)

    described = metadata(version)
    return ModelConfig(
        name=version.model, platform=described.platform, backend="onnxruntime_genai",
        max_batch_size=0, input=[typed(t) for t in described.inputs],
        output=[typed(t) for t in described.outputs],
        model_transaction_policy=TransactionPolicy(decoupled=True),
    )  # fmt: skip


def body_of(tensors: list[Tensor]) -> dict[str, Any]:
    """The generate body the input tensors make: each one's value by its name."""
    body: dict[str, Any] = {}
    for tensor in tensors:
        try:
            values = oip_codec.values(tensor)
        except ValueError as exc:
            raise BadRequest(f"input {tensor.name!r}: {exc}", param=tensor.name) from None
        if tensor.name in LISTS:
            body[tensor.name] = values
        elif len(values) != 1:
            raise BadRequest(f"input {tensor.name!r} holds {len(values)} values, not one (a "
                             "prompt a request).", param=tensor.name)  # fmt: skip
        else:
            body[tensor.name] = values[0]
    return body


def check_outputs(request: InferRequestBody) -> None:
    """A request may ask for ``text_output`` alone (or for no output by name: it is sent)."""
    for at, asked in enumerate(request.outputs or ()):
        if asked.name != OUTPUT:
            raise BadRequest(f"outputs[{at}].name: unknown output {asked.name!r}; the model has "
                             f"['{OUTPUT}']",
                             param=f"outputs[{at}].name")  # fmt: skip


async def prepare(
    kiln: Kiln, admission: Admission, address: tuple[str, str | None],
    request: InferRequestBody, tensors: list[Tensor], *, streams: bool = False,
) -> tuple[Generation, bool]:  # fmt: skip
    """The generate request the tensors make for the model at ``address`` (name, version),
    prepared, and whether it streams (``stream``: only where responses can, ``streams``)."""
    check_outputs(request)
    body = body_of(tensors)
    stream = body.pop("stream", False) is True
    if stream and not streams:
        raise BadRequest("'stream' needs gRPC's ModelStreamInfer (or REST's generate_stream).",
                         param="stream")  # fmt: skip
    return await generate.prepare(kiln, admission, *address, body, stream=stream), stream


def output(text: str) -> Tensor:
    """A piece of an answer as the ``text_output`` tensor."""
    return Tensor(name=OUTPUT, datatype="BYTES", shape=[1], data=tensor_bytes.pack([text]))


async def answer(gen: Generation) -> InferResult:
    """The whole answer (the input first, unless ``exclude_input_in_output``)."""
    (whole,) = await collect(gen)
    choice = gen.choices[0]
    return InferResult(request_id=gen.request.request_id,
                       outputs=[output(choice.echo + "".join(whole.parts))],
                       queue_ms=choice.queue_ms, compute_ms=choice.compute_ms)  # fmt: skip
