"""LoRA adapters: reading PEFT files, the slot table, and the patched graph's arithmetic
against numpy on a one-layer graph, rows of different adapters in one run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln_runtimes.backends._genai_lora import MASK, AdapterSlots, patch
from kiln_runtimes.lora import AdapterError, Dims, SlotTable, read_adapter

if TYPE_CHECKING:
    from pathlib import Path

DIMS = Dims(num_layers=1, hidden=8, q_size=8, kv_size=4)
QV = ("q_proj", "v_proj")


def test_an_adapter_is_transposed_and_scaled(peft: Any) -> None:
    weights = peft.tensors(DIMS, 2, QV, seed=1)
    adapter = read_adapter(peft.config(2, QV, alpha=8), weights, DIMS, max_rank=4)
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    np.testing.assert_array_equal(adapter.a[0, "q_proj"], weights[f"{key}.lora_A.weight"].T)
    np.testing.assert_allclose(adapter.b[0, "q_proj"], 4 * weights[f"{key}.lora_B.weight"].T)
    assert adapter.modules == QV


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"peft_type": "IA3"}, "config", "not LORA"),
        ({"target_modules": ["gate_proj"]}, "config", "target_modules"),
        ({"r": 0}, "config", "r must be"),
        ({"use_dora": True}, "config", "DoRA"),
        ({"fan_in_fan_out": True}, "config", "fan_in_fan_out"),
        ({"r": 3, "target_modules": ["q_proj", "k_proj"]}, "config", "needs 6 columns"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(
    peft: Any, change: dict[str, Any], field: str, words: str
) -> None:
    settings = {**peft.config(2, QV), **change}
    with pytest.raises(AdapterError, match=words) as caught:
        read_adapter(settings, peft.tensors(DIMS, 2, QV, seed=1), DIMS, max_rank=4)
    assert caught.value.field == field


@pytest.mark.parametrize("targets", [r".*\.(q_proj|v_proj)", "all-linear", r".*_proj"])
def test_target_modules_may_be_a_regular_expression(peft: Any, targets: str) -> None:
    settings = {**peft.config(2, QV), "target_modules": targets}
    adapter = read_adapter(settings, peft.tensors(DIMS, 2, QV, seed=1), DIMS, max_rank=4)
    assert adapter.modules == QV  # as the weights hold them


@pytest.mark.parametrize(("targets", "words"), [(r".*\.q_proj", "must match"), ("(", "not a")])
def test_a_regular_expression_the_weights_do_not_match_is_refused(
    peft: Any, targets: str, words: str
) -> None:
    settings = {**peft.config(2, QV), "target_modules": targets}
    with pytest.raises(AdapterError, match=words) as caught:
        read_adapter(settings, peft.tensors(DIMS, 2, QV, seed=1), DIMS, max_rank=4)
    assert caught.value.field == "config"


def test_weights_that_do_not_fit_the_model_are_refused(peft: Any) -> None:
    wider = Dims(num_layers=1, hidden=16, q_size=8, kv_size=4)
    with pytest.raises(AdapterError, match=r"shape \(2, 16\), this model needs \(2, 8\)"):
        read_adapter(peft.config(2, QV), peft.tensors(wider, 2, QV, seed=1), DIMS, max_rank=4)
    lonely = {k: v for k, v in peft.tensors(DIMS, 2, QV, seed=1).items() if "lora_A" in k}
    with pytest.raises(AdapterError, match="needs its B weight"):
        read_adapter(peft.config(2, QV), lonely, DIMS, max_rank=4)
    deeper = Dims(num_layers=2, hidden=8, q_size=8, kv_size=4)
    with pytest.raises(AdapterError, match="outside"):
        read_adapter(peft.config(2, QV), peft.tensors(deeper, 2, QV, seed=1), DIMS, max_rank=4)


def test_slots_are_shared_pinned_and_reused_least_recently_used_first() -> None:
    table = SlotTable(2)
    assert table.acquire("a") == (0, True)
    assert table.acquire("a") == (0, False)  # a second sequence of a: same slot, no load
    assert table.acquire("b") == (1, True)
    assert table.acquire("c") is None  # both pinned
    table.release("b")
    table.release("a")
    table.release("a")
    assert table.acquire("b") == (1, False)  # still there
    table.release("b")
    assert table.acquire("c") == (0, True)  # a was used least recently
    assert table.loaded() == 2


def _graph(path: Path, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``qkv = x·Wqkv`` and ``logits = h·Wo``, named as the GenAI builder names them."""
    w_qkv = rng.normal(size=(8, 16)).astype(np.float32)
    w_o = rng.normal(size=(8, 8)).astype(np.float32)
    name = "/model/layers.0/attn/{}/MatMul"
    nodes = [
        helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"], name=name.format("qkv_proj")),
        helper.make_node("MatMul", ["h", "w_o"], ["logits"], name=name.format("o_proj")),
    ]
    floats: list[str | int | None] = ["rows", "positions", 8]
    graph = helper.make_graph(
        nodes, "one-layer",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, floats) for n in ("x", "h")],
        [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["rows", "positions", 16]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, floats)],
        [numpy_helper.from_array(w_qkv, "w_qkv"), numpy_helper.from_array(w_o, "w_o")],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return {"qkv": w_qkv, "o": w_o}


def test_each_row_gets_its_own_adapter_in_one_run(peft: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    base = _graph(tmp_path / "model.onnx", rng)
    data, targets = patch(tmp_path / "model.onnx", DIMS, width=2 * 4)
    slots = AdapterSlots(targets, slots=2, rank=4, dtype=np.float32)
    first = peft.tensors(DIMS, 2, QV, seed=1, scale=0.5)
    second = peft.tensors(DIMS, 4, ("o_proj",), seed=2, scale=0.5)
    slots.load(0, read_adapter(peft.config(2, QV), first, DIMS, max_rank=4))
    slots.load(1, read_adapter(peft.config(4, ("o_proj",)), second, DIMS, max_rank=4))
    x, h = (
        rng.normal(size=(3, 5, 8)).astype(np.float32),
        rng.normal(size=(3, 5, 8)).astype(np.float32),
    )
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    feeds = {"x": x, "h": h, MASK: slots.mask([0, -1, 1]), **slots.inputs}
    qkv, logits = session.run(["qkv", "logits"], feeds)

    def delta(
        weights: dict[str, np.ndarray], module: str, inputs: np.ndarray, alpha: float, r: int
    ) -> np.ndarray:
        key = f"base_model.model.model.layers.0.self_attn.{module}"
        a, b = weights[f"{key}.lora_A.weight"], weights[f"{key}.lora_B.weight"]
        out: np.ndarray = inputs @ a.T @ b.T * (alpha / r)
        return out

    expected_qkv = x @ base["qkv"]
    expected_qkv[0, :, 0:8] += delta(first, "q_proj", x[0], 16, 2)
    expected_qkv[0, :, 12:16] += delta(first, "v_proj", x[0], 16, 2)
    expected_logits = h @ base["o"]
    expected_logits[2] += delta(second, "o_proj", h[2], 16, 4)
    np.testing.assert_allclose(qkv, expected_qkv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits, expected_logits, rtol=1e-5, atol=1e-5)
    assert not np.allclose(qkv[0], (x @ base["qkv"])[0])  # the adapter did something


def test_a_reloaded_slot_forgets_the_adapter_it_held(peft: Any, tmp_path: Path) -> None:
    _graph(tmp_path / "model.onnx", np.random.default_rng(0))
    _, targets = patch(tmp_path / "model.onnx", DIMS, width=4)
    slots = AdapterSlots(targets, slots=1, rank=4, dtype=np.float32)
    slots.load(0, read_adapter(peft.config(2, QV), peft.tensors(DIMS, 2, QV, seed=1), DIMS, 4))
    slots.load(
        0,
        read_adapter(
            peft.config(2, ("o_proj",)), peft.tensors(DIMS, 2, ("o_proj",), seed=2), DIMS, 4
        ),
    )
    qkv_a = next(v for k, v in slots.inputs.items() if k.endswith("qkv_proj.A"))
    assert not qkv_a.any()  # the first adapter's q and v columns were cleared
