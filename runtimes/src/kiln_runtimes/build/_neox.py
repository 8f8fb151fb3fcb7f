"""GPT-NeoX (Pythia, Dolly v2, RedPajama-INCITE…) and Falcon for the onnxruntime-genai builder,
which knows neither (``GPTNeoXForCausalLM``, ``FalconForCausalLM``).

Both: :mod:`._llamalike`'s LayerNorms, a GELU MLP (``dense_h_to_4h``, ``dense_4h_to_h``) and one
fused Q/K/V projection (``query_key_value``), split here into the three the builder takes. Its
rows run in groups, each its queries, then a key and a value (:func:`_split`): GPT-NeoX's a
group a head (``[q, k, v]`` of head 0, then of head 1…), Falcon-7B's one group of all heads with
one key and value (multi-query), Falcon-40B's and 180B's a group a key/value head
(``new_decoder_architecture``). A parallel layer adds its attention and its MLP to the stream at
once (:meth:`GptNeox.make_parallel`): each over its own norm of the stream (every Pythia;
Falcon-40B), or both over one (Falcon-7B). GPT-NeoX turns a quarter of each head with RoPE,
Falcon all of it; Falcon's ALiBi (Falcon-RW's) is refused.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kiln_runtimes.build._llamalike import LayerNormed
from kiln_runtimes.build._options import BuildError


class GptNeox(LayerNormed):
    """GPT-NeoX's decoder: ``GPTNeoXLayer``s under ``gpt_neox``."""

    def __init__(self, config: Any, *args: Any) -> None:
        config.num_key_value_heads = getattr(self, "key_value_heads", config.num_attention_heads)
        super().__init__(config, *args)
        self.mlp_attrs["use_proj"], self.mlp_attrs["use_fc"] = False, True

    def is_layer(self, module: Any) -> bool:
        return type(module).__name__ == "GPTNeoXLayer"

    def has_final_norm(self, module: Any, model: Any) -> bool:
        return module is model.gpt_neox.final_layer_norm

    def make_layer(self, layer_id: int, layer: Any) -> None:
        parts = _split(layer.attention.query_key_value, self.num_attn_heads, 1)
        attention = SimpleNamespace(dense=layer.attention.dense, **parts)
        mlp = SimpleNamespace(fc1=layer.mlp.dense_h_to_4h, fc2=layer.mlp.dense_4h_to_h)
        if layer.use_parallel_residual:
            self.make_parallel(layer_id, layer.input_layernorm, attention,
                               layer.post_attention_layernorm, mlp)  # fmt: skip
            return
        super().make_layer(layer_id, SimpleNamespace(
            input_layernorm=layer.input_layernorm, self_attn=attention,
            post_attention_layernorm=layer.post_attention_layernorm, mlp=mlp,
        ))  # fmt: skip

    def make_parallel(self, layer_id: int, norm: Any, attention: Any, mlp_norm: Any,
                      mlp: Any) -> None:  # fmt: skip
        """The stream plus ``attention`` over ``norm`` of it plus ``mlp`` over ``mlp_norm`` of
        it (``None``: over ``norm``'s output too)."""
        norms = self.layernorm_attrs
        self.make_layernorm(layer_id, norm, skip=not norms["first_layernorm"], simple=False,
                            location="input")  # fmt: skip
        normed = norms["output_0"]
        self.make_attention(layer_id, attention, root_input=normed)
        attended = norms["skip_input"]
        if mlp_norm is not None:  # of the stream (``root_input``), as the first norm was
            self.make_layernorm(layer_id, mlp_norm, skip=False, simple=False,
                                location="post_attention")  # fmt: skip
            normed = norms["output_0"]
        self.make_mlp(layer_id, mlp, root_input=normed)
        name = f"/model/layers.{layer_id}/residual_add/Add"
        self.make_add(name, [attended, norms["skip_input"]], dtype=self.io_dtype,
                      shape=self.make_hidden_state_shape())  # fmt: skip
        norms["skip_input"], norms["first_layernorm"] = f"{name}/output_0", False
        norms["last_layernorm"] = layer_id == self.num_layers - 1

    key_value_heads: int
    num_attn_heads: int
    num_layers: int


class Falcon(GptNeox):
    """Falcon's decoder: ``FalconDecoderLayer``s under ``transformer``."""

    is_layer = LayerNormed.is_layer

    def __init__(self, config: Any, *args: Any) -> None:
        if config.alibi:
            raise BuildError("Falcon's ALiBi positions are not built", file="config.json",
                             field="alibi")  # fmt: skip
        self.key_value_heads = (
            config.num_kv_heads if config.new_decoder_architecture
            else 1 if config.multi_query else config.num_attention_heads
        )  # fmt: skip
        config.intermediate_size, config.hidden_act = config.ffn_hidden_size, config.activation
        super().__init__(config, *args)

    def has_final_norm(self, module: Any, model: Any) -> bool:
        return module is model.transformer.ln_f

    def make_layer(self, layer_id: int, layer: Any) -> None:
        groups = self.key_value_heads
        fused = layer.self_attention.query_key_value
        parts = _split(fused, groups, self.num_attn_heads // groups)
        attention = SimpleNamespace(dense=layer.self_attention.dense, **parts)
        mlp = SimpleNamespace(fc1=layer.mlp.dense_h_to_4h, fc2=layer.mlp.dense_4h_to_h)
        if hasattr(layer, "ln_attn"):
            self.make_parallel(layer_id, layer.ln_attn, attention, layer.ln_mlp, mlp)
        elif layer.config.parallel_attn:
            self.make_parallel(layer_id, layer.input_layernorm, attention, None, mlp)
        else:
            LayerNormed.make_layer(self, layer_id, SimpleNamespace(
                input_layernorm=layer.input_layernorm, self_attn=attention,
                post_attention_layernorm=layer.post_attention_layernorm, mlp=mlp,
            ))  # fmt: skip


def _split(fused: Any, groups: int, queries: int) -> dict[str, SimpleNamespace]:
    """A fused Q/K/V projection whose rows run in ``groups``, each ``queries`` query heads, then
    a key head and a value head, as the three projections."""
    weight = fused.weight.view(groups, queries + 2, -1, fused.weight.shape[-1])
    bias = fused.bias.view(groups, queries + 2, -1) if fused.bias is not None else None
    picks = {"q": slice(0, queries), "k": slice(queries, queries + 1),
             "v": slice(queries + 1, queries + 2)}  # fmt: skip
    return {
        f"{part}_proj": SimpleNamespace(
            weight=weight[:, rows].reshape(-1, weight.shape[-1]),
            bias=bias[:, rows].reshape(-1) if bias is not None else None,
        )
        for part, rows in picks.items()
    }


MODEL_TYPES = {"gpt_neox": GptNeox, "falcon": Falcon}
