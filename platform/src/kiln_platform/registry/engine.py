"""A version's engine settings: what its workers run with, set at import, changeable later.

Each field left unset falls back to the deployment's ``KILN_WORKER_*`` default, so versions
registered before migration ``0011`` (an empty object) run as they always did.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

Positive = Annotated[int, msgspec.Meta(ge=1, le=1 << 20)]
Slots = Annotated[int, msgspec.Meta(ge=0, le=64)]
MinReplicas = Annotated[int, msgspec.Meta(ge=0, le=64)]
MaxReplicas = Annotated[int, msgspec.Meta(ge=1, le=64)]
Target = Literal["cpu", "cuda", "tensorrt"]
Precision = Literal["int4", "int8", "fp16", "fp32"]


class EngineSettings(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Per-version worker settings (``model_versions.engine_settings``)."""

    target: Target | None = None
    """What the engine runs on: the build's target (generation, embeddings) or the compile
    target of a tensor model's engine."""
    precision: Precision | None = None
    """The build's weight precision, or a tensor model's engine precision."""
    score_prompts: bool | None = None
    """A generation build computes every position's logits, so requests can score their
    prompt (``echo`` with ``logprobs``); else the last position's only (``prune_lm_head``:
    prefill 15 to 25% cheaper). Set at import."""
    max_batch_size: Positive | None = None
    """Items per batch (embeddings, tensors) or concurrent sequences (generation)."""
    max_context: Positive | None = None
    """Tokens a request may use, prompt and output together; at most the model's own context."""
    adapter_slots: Slots | None = None
    """LoRA adapters a generation worker holds at once (0: none)."""
    min_replicas: MinReplicas | None = None
    """Workers the version's pool keeps even when idle (else ``KILN_POOL_MIN_REPLICAS``)."""
    max_replicas: MaxReplicas | None = None
    """Workers the autoscaler may run for it (else ``KILN_POOL_MAX_REPLICAS``)."""


class EngineUpdate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``PATCH /admin/v1/models/{name}/versions/{version}``: the settings to change; ``null``
    returns one to the deployment's default. Target and precision of a built model are what
    it was built for (import it again to change them); a tensor model's can change."""

    max_batch_size: Positive | msgspec.UnsetType | None = msgspec.UNSET
    max_context: Positive | msgspec.UnsetType | None = msgspec.UNSET
    adapter_slots: Slots | msgspec.UnsetType | None = msgspec.UNSET
    target: Target | msgspec.UnsetType | None = msgspec.UNSET
    precision: Precision | msgspec.UnsetType | None = msgspec.UNSET
    min_replicas: MinReplicas | msgspec.UnsetType | None = msgspec.UNSET
    max_replicas: MaxReplicas | msgspec.UnsetType | None = msgspec.UNSET


def merged(current: EngineSettings, update: EngineUpdate) -> EngineSettings:
    """``current`` with the fields ``update`` sets."""
    changes = {
        f: getattr(update, f)
        for f in update.__struct_fields__
        if getattr(update, f) is not msgspec.UNSET
    }
    return msgspec.structs.replace(current, **changes)


SCALING = ("min_replicas", "max_replicas")
"""The fields the pool manager reads (``pools.autoscale.bounded``): changing them resizes a
pool; every other field restarts its workers."""


def worker_settings(settings: EngineSettings) -> EngineSettings:
    """``settings`` without the pool bounds: what a version's workers are started with."""
    return msgspec.structs.replace(settings, min_replicas=None, max_replicas=None)


def check_bounds(settings: EngineSettings) -> None:
    """``ValueError`` naming ``min_replicas`` when it exceeds ``max_replicas``."""
    low, high = settings.min_replicas, settings.max_replicas
    if low is not None and high is not None and low > high:
        raise ValueError(f"min_replicas ({low}) exceeds max_replicas ({high})")


def decode(value: object) -> EngineSettings:
    """The settings stored in a JSONB column (None or ``{}``: all defaults)."""
    return msgspec.convert(value or {}, EngineSettings)
