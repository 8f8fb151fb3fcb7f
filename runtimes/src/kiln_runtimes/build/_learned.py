"""GPT-2, GPTBigCode and OPT for the onnxruntime-genai builder, which has none of them
(``GPT2LMHeadModel``, ``GPTBigCodeForCausalLM``, ``OPTForCausalLM``): decoders whose positions
are learned embeddings, not RoPE.

A position's embedding is added to its token's before the first layer. The graph has no
``position_ids`` input (Kiln's runner and GenAI's Generator feed ``input_ids`` and
``attention_mask``), so positions are read from the mask, as the attention reads lengths from
it: token ``i`` of a row of ``S`` new tokens is at ``sum(mask) - S + i``. That holds for what
runs these graphs: a prefill is one row without padding, a decode step one new token a row.

GPT-2: LayerNorms with biases, the fused Q/K/V and output projections stored as ``Conv1D``
(``[in, out]``: transposed to a linear layer's ``[out, in]`` here), a tanh-GELU MLP of the same
kind, a tied head; ``scale_attn_by_inverse_layer_idx`` and ``reorder_and_upcast_attn`` are
refused. GPTBigCode (StarCoder 1, SantaCoder): GPT-2's block in ``Linear`` layers, multi-query
(one key and value head) or not. OPT: its positions offset by 2 rows, pre-norm layers whose MLP
(``fc1``, ReLU, ``fc2``) sits on the layer itself; a post-norm config (``do_layer_norm_before``
false, OPT-350m's) or one that projects its embeddings (``word_embed_proj_dim``) is refused.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

import onnx_ir as ir
import onnxruntime_genai.models  # noqa: F401 (puts the builder's own folder on sys.path)

from kiln_runtimes.build._nodes import make_labelled
from kiln_runtimes.build._options import BuildError
from kiln_runtimes.build._positions import make_positions

builders: Any = importlib.import_module("builders")
INT64 = "/model/constants/INT64"


class Learned(builders.Model):  # type: ignore[misc]
    """A decoder with learned positions, LayerNorms and no RoPE."""

    offset = 0
    """Rows of the position table before position 0 (OPT's 2)."""

    def __init__(self, config: Any, *args: Any) -> None:
        config.hidden_act = config.activation_function
        config.num_key_value_heads = self.kv_heads(config)
        super().__init__(config, *args)
        self.layernorm_attrs["simple"] = False
        self.attention_attrs["rope"] = self.attention_attrs["use_rope_in_attn"] = False
        self.input_names.pop("position_ids", None)
        self.mlp_attrs["use_proj"], self.mlp_attrs["use_fc"] = False, True

    def positions(self) -> Any:
        """The position table, ``[rows, hidden]``."""
        raise NotImplementedError

    def kv_heads(self, config: Any) -> int:
        """Key and value heads: one a query head (no grouped queries)."""
        return int(config.num_attention_heads)

    def make_embedding(self, embedding: Any) -> None:
        super().make_embedding(embedding)
        table = "model.embed_positions.weight"
        self.make_initializer(self.positions(), table, to=self.io_dtype)
        name, shape = "/model/embed_positions", self.make_hidden_state_shape()
        positions = make_positions(self, name)
        # op, inputs (":X": node X's output), output shape
        nodes: tuple[tuple[str, list[str], list[Any]], ...] = (
            ("Offset", [positions, f"{INT64}/{self.offset}"], ["batch_size", "sequence_length"]),
            ("Gather", [table, ":Offset"], shape),
            ("Tokens", [self.layernorm_attrs["root_input"], ":Gather"], shape),
        )
        for op, inputs, dims in nodes:
            kind = "Add" if op in ("Offset", "Tokens") else op
            dtype = ir.DataType.INT64 if op == "Offset" else self.io_dtype
            make_labelled(self, name, op, kind, inputs, dtype=dtype, dims=dims)
        self.layernorm_attrs["root_input"] = self.layernorm_attrs["skip_input"] = (
            f"{name}/Tokens/output_0"
        )


class Gpt2(Learned):
    """GPT-2: ``transformer.h`` blocks of ``Conv1D`` projections."""

    def __init__(self, config: Any, *args: Any) -> None:
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if getattr(config, flag, False):
                raise BuildError(f"GPT-2's {flag} is not built", file="config.json", field=flag)
        config.intermediate_size = config.n_inner or 4 * config.n_embd
        super().__init__(config, *args)

    def positions(self) -> Any:
        return self.weights.transformer.wpe.weight

    def is_layer(self, module: Any) -> bool:
        return type(module).__name__ == "GPT2Block"

    def has_final_norm(self, module: Any, model: Any) -> bool:
        return module is model.transformer.ln_f

    def make_layer(self, layer_id: int, block: Any) -> None:
        q, k, v = (_linear(part) for part in _conv_split(block.attn.c_attn, 3))
        layer = SimpleNamespace(
            input_layernorm=block.ln_1, post_attention_layernorm=block.ln_2,
            self_attn=SimpleNamespace(q_proj=q, k_proj=k, v_proj=v,
                                      o_proj=_linear(block.attn.c_proj)),
            mlp=SimpleNamespace(fc1=_linear(block.mlp.c_fc), fc2=_linear(block.mlp.c_proj)),
        )  # fmt: skip
        super().make_layer(layer_id, layer)

    weights: Any


def _conv_split(conv: Any, parts: int) -> list[SimpleNamespace]:
    """A fused ``Conv1D``'s ``parts`` equal column blocks, each a ``Conv1D``-like namespace."""
    width = conv.weight.shape[1] // parts
    return [
        SimpleNamespace(weight=conv.weight[:, i * width:(i + 1) * width],
                        bias=conv.bias[i * width:(i + 1) * width])
        for i in range(parts)
    ]  # fmt: skip


def _linear(conv: Any) -> SimpleNamespace:
    """A ``Conv1D`` (``[in, out]``) as a linear layer (``[out, in]``)."""
    return SimpleNamespace(weight=conv.weight.t().contiguous(), bias=conv.bias)


class Opt(Learned):
    """OPT: pre-norm layers, their MLP on the layer, the final norm before the layers."""

    offset = 2

    def __init__(self, config: Any, *args: Any) -> None:
        if not config.do_layer_norm_before:
            raise BuildError("OPT with post-norm layers is not built", file="config.json",
                             field="do_layer_norm_before")  # fmt: skip
        if config.word_embed_proj_dim != config.hidden_size:
            raise BuildError("OPT with projected embeddings is not built", file="config.json",
                             field="word_embed_proj_dim")  # fmt: skip
        config.intermediate_size = config.ffn_dim
        super().__init__(config, *args)
        self.layernorm_attrs["epsilon"] = 1e-5  # torch's LayerNorm, OPT's

    def positions(self) -> Any:
        return self.weights.model.decoder.embed_positions.weight

    def has_final_norm(self, module: Any, model: Any) -> bool:
        return False  # listed before the layers, so :meth:`make_layer` makes it after the last

    def make_layer(self, layer_id: int, layer: Any) -> None:
        flat = SimpleNamespace(
            input_layernorm=layer.self_attn_layer_norm, self_attn=layer.self_attn,
            post_attention_layernorm=layer.final_layer_norm,
            mlp=SimpleNamespace(fc1=layer.fc1, fc2=layer.fc2),
        )  # fmt: skip
        super().make_layer(layer_id, flat)
        if layer_id == self.num_layers - 1:
            norm = self.weights.model.decoder.final_layer_norm
            self.make_layernorm(layer_id + 1, norm, skip=True, simple=False, location="final_norm")

    num_layers: int
    weights: Any


class BigCode(Gpt2):
    """GPTBigCode (StarCoder, SantaCoder, WizardCoder): GPT-2's block in ``Linear`` layers, one
    key and value head for every query head if ``multi_query`` (else each head's query, key
    and value rows side by side)."""

    def __init__(self, config: Any, *args: Any) -> None:
        if not config.scale_attn_weights:
            raise BuildError("GPTBigCode without scale_attn_weights is not built",
                             file="config.json", field="scale_attn_weights")  # fmt: skip
        super().__init__(config, *args)

    def kv_heads(self, config: Any) -> int:
        return 1 if config.multi_query else int(config.num_attention_heads)

    def is_layer(self, module: Any) -> bool:
        return type(module).__name__ == "GPTBigCodeBlock"

    def make_layer(self, layer_id: int, block: Any) -> None:
        fused, size = block.attn.c_attn, self.head_size
        if self.num_kv_heads == 1:  # the queries' rows, then one key's, one value's
            rows = (self.q_size, size, size)
            q, k, v = (SimpleNamespace(weight=w, bias=b) for w, b in zip(
                fused.weight.split(rows), fused.bias.split(rows), strict=True))  # fmt: skip
        else:  # each head's query, key and value rows in turn
            heads = self.num_attn_heads
            weight, bias = fused.weight.view(heads, 3, size, -1), fused.bias.view(heads, 3, size)
            q, k, v = (SimpleNamespace(weight=weight[:, i].reshape(heads * size, -1),
                                       bias=bias[:, i].reshape(-1)) for i in range(3))  # fmt: skip
        layer = SimpleNamespace(
            input_layernorm=block.ln_1, post_attention_layernorm=block.ln_2,
            self_attn=SimpleNamespace(q_proj=q, k_proj=k, v_proj=v, o_proj=block.attn.c_proj),
            mlp=SimpleNamespace(fc1=block.mlp.c_fc, fc2=block.mlp.c_proj),
        )  # fmt: skip
        Learned.make_layer(self, layer_id, layer)

    num_attn_heads: int
    head_size: int
    q_size: int
    num_kv_heads: int


MODEL_TYPES = {"gpt2": Gpt2, "opt": Opt, "gpt_bigcode": BigCode}
