"""vLLM's classification API (``POST /classify``, ``/v1/classify``) on an imported sequence
classifier: each text's probabilities over the model's labels (the softmax of its logits, or
each label's sigmoid for a multi-label classifier, as transformers' text-classification
pipeline) and the most probable label."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec

from kiln_platform.gateway import services

if TYPE_CHECKING:
    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln


class ClassifyRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/classify``; ``input`` takes what ``/v1/embeddings`` takes (a text, texts,
    token ids or lists of them)."""

    model: str
    input: str | list[Any]
    truncate_prompt_tokens: int | None = None
    user: str | None = None


class Classification(msgspec.Struct, kw_only=True):
    """One text's answer: the most probable label and every label's probability."""

    index: int
    label: str
    probs: list[float]
    num_classes: int


class ClassifyUsage(msgspec.Struct, kw_only=True):
    """Tokens read (nothing is generated)."""

    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ClassifyResponse(msgspec.Struct, kw_only=True):
    """``POST /v1/classify`` response: an answer per input, in order."""

    id: str
    created: int
    model: str
    data: list[Classification]
    usage: ClassifyUsage
    object: str = "list"


async def classify(kiln: Kiln, admission: Admission, request: ClassifyRequest) -> ClassifyResponse:
    """Serve ``POST /v1/classify``; its admission records the usage."""
    done = await services.encode(
        kiln, admission, request.model, request.input, endpoint="classify",
        truncate=request.truncate_prompt_tokens,
    )  # fmt: skip
    labels = done.version.manifest.labels
    data = [
        Classification(index=i, label=labels[int(row.argmax())], probs=row.tolist(),
                       num_classes=len(labels))
        for i, row in enumerate(done.vectors)
    ]  # fmt: skip
    return ClassifyResponse(
        id=f"classify-{admission.request_id.removeprefix('req_')}", created=int(time.time()),
        model=request.model, data=data,
        usage=ClassifyUsage(prompt_tokens=done.tokens, total_tokens=done.tokens),
    )  # fmt: skip
