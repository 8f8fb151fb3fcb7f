"""YaRN's RoPE for the builder equals transformers' ``_compute_yarn_parameters`` on the configs
real models ship: betas left out, ``truncate`` off (GPT-OSS's), ``mscale`` with
``mscale_all_dim`` (DeepSeek's) and an explicit ``attention_factor``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import Qwen2Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from kiln_runtimes.build import _rope

QWEN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


@pytest.mark.parametrize(
    "params",
    [
        QWEN,
        {**QWEN, "beta_fast": 16.0, "beta_slow": 2.0},
        {**QWEN, "factor": 32.0, "truncate": False, "beta_fast": 32.0, "beta_slow": 1.0},
        {**QWEN, "mscale": 0.707, "mscale_all_dim": 1.0},
        {**QWEN, "mscale": 1.0},  # alone it changes nothing in transformers
        {**QWEN, "attention_factor": 1.25},
        {**QWEN, "original_max_position_embeddings": 64, "factor": 4.0},  # a range clipped at 0
    ],
)
def test_yarn_equals_transformers(params: dict[str, Any]) -> None:
    theta, head = 1_000_000.0, 128
    config = Qwen2Config(
        hidden_size=head * 4, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4 * params["original_max_position_embeddings"],
        rope_parameters={**params, "rope_theta": theta},
    )  # fmt: skip
    want, scale = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    plain = 1.0 / theta ** (torch.arange(0, head, 2, dtype=torch.int64).float() / head)
    factor = params["factor"]
    got = _rope.inv_freq(plain, _rope.ntk(params, factor), theta,
                         params["original_max_position_embeddings"])  # fmt: skip
    assert torch.allclose(got, want, rtol=1e-6, atol=0)
    assert _rope.attention_factor(params, factor) == pytest.approx(scale, rel=1e-9)
    assert not torch.allclose(plain, want)  # YaRN changed the frequencies it should
