"""The onnxruntime-genai builder on its own arguments (:func:`main`, or ``python -m``), with Kiln's
mends of what the installed version misreads; the build's accuracy check holds each to the
source model.

Gemma 3: transformers 5 configures its RoPE per layer type (``rope_parameters:
{"full_attention": {...}, "sliding_attention": {...}}``), and the builder reads it only flat
(a ``KeyError: 'rope_type'``). :class:`Gemma3` reads the global layers' RoPE (theta, and a
``linear`` scaling) from ``full_attention`` and the local layers' theta from
``sliding_attention``, unscaled, as transformers runs them.

YaRN (Qwen2's and Qwen3's long-context RoPE, GPT-OSS's): the builder divides by zero when the
config leaves ``beta_fast`` and ``beta_slow`` out, asserts on a correction range transformers
clips, never rounds the range (transformers' ``truncate``, on by default) and takes a lone
``mscale`` as the attention factor. :func:`yarn_init` and :func:`yarn_inv_freq` compute it as
transformers does (:mod:`._rope`).

OLMo: its norms are LayerNorms without weights at an epsilon of 1e-5; the builder made them
RMSNorms at 1e-6 (a logit off by 7 on a tiny model). :class:`Olmo` builds them as transformers
runs them, with ``clip_qkv``, which the builder leaves out (:class:`._olmo2.Clipped`).

OLMo 2 and 3, which the builder does not know: :mod:`._olmo2` (their post-norms and Q/K norms
across all heads; OLMo 3's sliding windows), dispatched as OLMo. StableLM, Starcoder2, Command
R, GPT-2, OPT, GPT-NeoX, Falcon and GLM, which it does not know either: :mod:`._llamalike`,
:mod:`._cohere`, :mod:`._learned`, :mod:`._neox`, :mod:`._glm`, dispatched as Llama.
Mixture-of-experts decoders (Mixtral, Qwen2/3-MoE, Granite's, OLMoE, ERNIE 4.5's, GLM-4.5,
HunYuan's, MiniMax-M2, dots.llm1): :mod:`._moe` (the sparse block as ONNX Runtime's ``MoE``
node, :mod:`._experts`; where a biased score chooses the experts, chosen in the graph),
dispatched as their dense hosts.
Each is read under its host's name (``_kilns.HOSTS``), whose class :func:`by_model_type` swaps
for Kiln's (:data:`KILNS`).

LayerNorms' epsilon: the builder reads ``rms_norm_eps`` only, else takes 1e-6, so Phi-2's and
Nemotron's norms (``layer_norm_eps``, ``norm_eps``, 1e-5) were built at 1e-6 (logits 1.8e-3
and 9.5e-3 off on tiny models, 3.4e-5 and 1.1e-4 now). :func:`read_epsilon` reads the config's
own (:data:`EPSILONS`).

HunYuan: its Q/K norms come after RoPE, so the builder turns RoPE outside the attention node
on a ``position_ids`` input Kiln's runner does not feed; :class:`._positions.HunYuan` reads the
positions from the mask. Input a mend refuses is a ``BuildError`` naming ``config.json`` and
the field (``_genai.run_builder`` sends it back from the builder's process).

SmolLM3: its layers without RoPE (``no_rope_layers``, every fourth) were built with RoPE moved
out of the attention node, which asks for a ``position_ids`` input the graph does not have
(``KeyError: 'position_ids'``). :class:`SmolLM3` builds them with no RoPE at all.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
from typing import Any

import onnxruntime_genai.models
import transformers

from kiln_runtimes.build import (
    _apertus,
    _cohere,
    _exaone,
    _glm,
    _learned,
    _llamalike,
    _mistral3,
    _moe,
    _neox,
    _positions,
    _qwen_vl,
    _rope,
)
from kiln_runtimes.build._kilns import HOSTS
from kiln_runtimes.build._olmo2 import Clipped, Olmo2, Olmo3
from kiln_runtimes.build._options import BuildError

builders: Any = importlib.import_module("builders")  # the package `builder.py` imports from
BASE_INIT = builders.Model.__init__
BASE_ROPE_INIT = builders.Model.make_rope_init
LLAMA = builders.LlamaModel
GLOBAL = ("cos_cache_global", "sin_cache_global")
LOCAL = ("cos_cache_local", "sin_cache_local")
READ_CONFIG = transformers.AutoConfig.from_pretrained
KILNS = {
    "olmo2": Olmo2, "olmo3": Olmo3, **_llamalike.MODEL_TYPES, **_cohere.MODEL_TYPES,
    **_learned.MODEL_TYPES, **_neox.MODEL_TYPES, **_glm.MODEL_TYPES, **_moe.MODEL_TYPES,
    **_mistral3.MODEL_TYPES, **_exaone.MODEL_TYPES, **_apertus.MODEL_TYPES,
}  # fmt: skip
"""Kiln's decoder class for each ``model_type`` it builds (whatever host it is read under)."""
HOST_CLASSES = ("OLMoModel", "LlamaModel", "MistralModel", "QwenModel", "Qwen3Model",
                "GraniteModel", "ErnieModel", "HunyuanDenseV1Model")  # fmt: skip
"""The builder's classes for the hosts of ``_kilns.HOSTS`` (``QwenModel``: Qwen2's)."""


class Gemma3(builders.Gemma3Model):  # type: ignore[misc]
    """Gemma 3's builder, reading RoPE per layer type."""

    def make_rope_init(self, config: Any) -> None:
        layered = getattr(config, "rope_parameters", None)
        if isinstance(layered, dict) and "full_attention" in layered:
            full, local = layered["full_attention"], layered["sliding_attention"]
            if local.get("rope_type", "default") != "default":
                raise BuildError(
                    f"Gemma 3's local layers with {local['rope_type']!r} RoPE are not built",
                    file="config.json",
                    field="rope_parameters.sliding_attention.rope_type",
                )
            config.rope_parameters = full
            config.rope_local_base_freq = local["rope_theta"]
            self.rope_attrs["theta"] = full["rope_theta"]
        super().make_rope_init(config)

    def make_rotary_embedding_multi_cache(self) -> None:
        self.cos_cache_global_name, self.sin_cache_global_name = GLOBAL
        self.make_caches(*GLOBAL)
        self.rope_attrs["create_caches"] = True
        self.rope_attrs["theta"] = self.rope_local_theta
        self.rope_attrs["rescale_factors"] = 1  # the global layers' scaling only
        self.cos_cache_local_name, self.sin_cache_local_name = LOCAL
        self.make_caches(*LOCAL)

    def make_caches(self, cos: str, sin: str) -> None:
        """The base builder's caches of these names (Gemma 3's own picks them per layer)."""
        builders.Gemma2Model.make_rotary_embedding_caches(
            self, cos_cache_name=cos, sin_cache_name=sin
        )


class Olmo(Clipped, builders.OLMoModel):  # type: ignore[misc]
    """OLMo's builder, with OLMo's LayerNorm and ``clip_qkv``."""

    def __init__(self, config: Any, *args: Any) -> None:
        super().__init__(config, *args)
        self.layernorm_attrs["simple"] = False
        self.layernorm_attrs["epsilon"] = 1e-5  # transformers' OlmoLayerNorm


class GraniteHybrid(builders.GraniteMoEHybridModel):  # type: ignore[misc]
    """Granite 4's builder, which exports attention layers and the shared MLP only (Granite 4.0
    Micro): Mamba layers (the H models) and routed experts are refused by field, not built
    into a graph that answers unlike its source."""

    def __init__(self, config: Any, *args: Any) -> None:
        kinds = set(getattr(config, "layer_types", None) or ()) - {"attention", "full_attention"}
        if kinds:
            raise BuildError(f"Granite 4's Mamba layers ({', '.join(sorted(kinds))}) are not built "
                             "(attention layers only)", file="config.json",
                             field="layer_types")  # fmt: skip
        if getattr(config, "num_local_experts", 0):
            raise BuildError("Granite 4's routed experts are not built (its shared MLP only)",
                             file="config.json", field="num_local_experts")  # fmt: skip
        super().__init__(config, *args)


def by_model_type(host: Any) -> Any:
    """What the builder builds for a host architecture of ``_kilns.HOSTS``: Kiln's class for a
    config read under its name (:data:`KILNS`, by ``model_type``), else the host's own."""

    def build(config: Any, *args: Any) -> Any:
        return KILNS.get(config.model_type, host)(config, *args)

    return build


def read_config(*args: Any, **kwargs: Any) -> Any:
    """``AutoConfig.from_pretrained``, an architecture of ``_kilns.HOSTS`` under its host's name."""
    config = READ_CONFIG(*args, **kwargs)
    names = list(getattr(config, "architectures", None) or ())
    if names[:1] and names[0] in HOSTS:
        config.architectures = [HOSTS[names[0]], *names[1:]]
    return config


class SmolLM3(builders.SmolLM3Model):  # type: ignore[misc]
    """SmolLM3's builder: a layer of ``no_rope_layers`` 0 gets no RoPE, as in transformers."""

    window_size: int

    def make_attention(self, layer_id: int, attention: Any, root_input: str, **kwargs: Any) -> None:
        full = self.layer_types[layer_id] == "full_attention"
        with _rope.without(self, rope=not self.no_rope_layers[layer_id], window=full):
            LLAMA.make_attention(self, layer_id, attention, root_input, **kwargs)


EPSILONS = ("layer_norm_eps", "norm_eps", "layer_norm_epsilon", "norm_epsilon")
"""Where configs without ``rms_norm_eps`` keep their norms' epsilon (Phi-2's and GPT-NeoX's,
Nemotron's, GPT-2's, Starcoder2's)."""


def read_epsilon(self: Any, config: Any, *args: Any) -> None:
    """The base builder's settings, its norms' epsilon the config's under any of
    :data:`EPSILONS` (the builder reads ``rms_norm_eps`` only, else 1e-6)."""
    BASE_INIT(self, config, *args)
    named = (getattr(config, name, None) for name in ("rms_norm_eps", *EPSILONS))
    self.layernorm_attrs["epsilon"] = next((e for e in named if e is not None), 1e-6)


def yarn_init(self: Any, config: Any) -> None:
    """The base builder's RoPE settings, YaRN's as transformers reads them."""
    params = getattr(config, "rope_parameters", None)
    if not (isinstance(params, dict) and params.get("rope_type") == "yarn"):
        BASE_ROPE_INIT(self, config)
        return
    factor = params.get("factor") or config.max_position_embeddings / self.original_context_length
    self.rope_attrs["mscale"] = _rope.attention_factor(params, factor)
    self.rope_attrs["rescale_inv_freq"] = _rope.ntk(params, factor)


def yarn_inv_freq(self: Any, inv_freq: Any) -> Any:
    """YaRN's inverse frequencies, as transformers computes them."""
    rescale = self.rope_attrs["rescale_inv_freq"]
    return _rope.inv_freq(inv_freq, rescale, self.rope_attrs["theta"], self.original_context_length)


def main(argv: list[str]) -> None:
    """Run the builder on its own command line ``argv``, with Kiln's mends (once a process:
    each build's builder is a process of its own, ``_genai.run_builder``)."""
    builders.Gemma3Model = Gemma3  # the builder's dispatch imports them from here
    builders.Mistral3TextModel = _mistral3.Mistral3
    builders.Qwen25VLTextModel, builders.Qwen3VLTextModel = _qwen_vl.Qwen25VL, _qwen_vl.Qwen3VL
    builders.HunyuanDenseV1Model = _positions.HunYuan
    builders.GraniteMoEHybridModel = GraniteHybrid
    builders.qwen.Qwen35Model = _qwen_vl.Qwen35  # the builder imports them from there
    builders.qwen.Qwen35MoEModel = _qwen_vl.Qwen35Moe
    builders.OLMoModel = Olmo  # OLMo's own, mended
    for name in HOST_CLASSES:
        setattr(builders, name, by_model_type(getattr(builders, name)))
    transformers.AutoConfig.from_pretrained = read_config  # type: ignore[method-assign]
    builders.SmolLM3Model = SmolLM3
    builders.Model.__init__ = read_epsilon
    builders.Model.make_rope_init = yarn_init
    builders.Model.make_inv_freq_rescaled_with_ntk = yarn_inv_freq
    folder = os.path.dirname(onnxruntime_genai.models.__file__)  # its sibling modules
    sys.path += [] if folder in sys.path else [folder]  # (a forked process's path is reset)
    sys.argv = ["builder", *argv]
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
