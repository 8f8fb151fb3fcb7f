"""Either kind of model behind the Open Inference Protocol, picked by its task: a tensor
model's own tensors (``oip_services``) or an LLM's text tensors (``oip_llm``). REST and gRPC
ask here, so the two faces answer alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln_platform.gateway import oip_codec, oip_llm
from kiln_platform.gateway import oip_services as oip

if TYPE_CHECKING:
    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln
    from kiln_platform.gateway.oip_schemas import InferRequestBody, ModelConfig, ModelMetadata
    from kiln_platform.registry.services import ResolvedVersion
    from kiln_platform.settings import Settings
    from kiln_runtimes.protocol import InferResult, Tensor


def is_llm(version: ResolvedVersion) -> bool:
    """Whether the version is an LLM (text in, text out) rather than a tensor model."""
    return version.manifest.task == "generate"


def metadata(version: ResolvedVersion) -> ModelMetadata:
    """``GET /v2/models/{name}`` (gRPC ``ModelMetadata``)."""
    return oip_llm.metadata(version) if is_llm(version) else oip.model_metadata(version)


def config(version: ResolvedVersion, settings: Settings) -> ModelConfig:
    """``GET /v2/models/{name}/config`` (gRPC ``ModelConfig``)."""
    return oip_llm.config(version) if is_llm(version) else oip.model_config(version, settings)


async def run(
    kiln: Kiln, admission: Admission, version: ResolvedVersion, request: InferRequestBody,
    tensors: list[Tensor], *, address: tuple[str, str | None],
) -> tuple[InferResult, ResolvedVersion]:  # fmt: skip
    """The answer to the tensors and the version that gave it: an LLM's request is resolved
    again by its ``address`` (name, version asked) as every generation is, so a rollout's split
    may pick another version than ``version``."""
    if not is_llm(version):
        return await oip.run(kiln, admission, version, request, tensors), version
    gen, _ = await oip_llm.prepare(kiln, admission, address, request, tensors)
    return await oip_llm.answer(gen), gen.version


async def infer(
    kiln: Kiln, admission: Admission, version: ResolvedVersion, body: bytes,
    *, address: tuple[str, str | None], header_length: str | None,
) -> tuple[bytes, dict[str, str]]:  # fmt: skip
    """REST's ``…/infer``: decode the body, ``run`` it, encode the answer."""
    request, tensors = oip_codec.parse(body, header_length)
    result, served = await run(kiln, admission, version, request, tensors, address=address)
    return oip_codec.encode(request, result, served.model, served.version)
