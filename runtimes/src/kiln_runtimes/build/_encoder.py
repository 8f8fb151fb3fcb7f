"""Embeddings graphs: an encoder with its pooling and normalization traced to one ONNX file.

The graph takes ``input_ids`` and ``attention_mask`` (int64, ``[batch, sequence]``, right-padded
by the worker) and returns ``embeddings`` (float32, ``[batch, dimensions]``).
"""

from __future__ import annotations

import contextlib
import inspect
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln_runtimes.build._options import BuildError
from kiln_runtimes.build._source import read_json

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import torch
    from tokenizers import Tokenizer

    from kiln_runtimes.build._pooling import Head

OPSET = 17
EXPORT_SENTENCES = ("a cat sits on the mat", "Kiln exports this graph", "Café crème")


def load(folder: Path, head: Head) -> tuple[torch.nn.Module, int, int]:
    """The encoder wrapped with its head, its output width and its position limit."""
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(
        str(folder / head.encoder_dir), local_files_only=True, attn_implementation="eager",
        dtype="float32",
    )  # fmt: skip
    config = encoder.config
    dense = [_dense(folder / path) for path in head.dense]
    pooled = int(config.hidden_size) * len(head.pooling.split("+"))
    width = int(dense[-1].out_features) if dense else pooled
    positions = context(folder / head.encoder_dir, int(config.max_position_embeddings))
    return _wrap(encoder, dense, head), width, positions


def context(folder: Path, positions: int) -> int:
    """The tokens an input may have, as sentence-transformers and transformers read it: the
    ``max_seq_length`` of ``sentence_bert_config.json`` when given (all-MiniLM-L6-v2: 256 of
    its 512 positions), else the tokenizer's ``model_max_length`` (RoBERTa: 512 of 514), never
    past the model's positions."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"),
                      ("tokenizer_config.json", "model_max_length")):  # fmt: skip
        path = folder / name
        value = read_json(path).get(key) if path.is_file() else None
        if isinstance(value, int) and value > 0:
            return min(value, positions)
    return positions


def _dense(path: Path) -> Any:
    """A sentence-transformers ``Dense`` module (a linear layer and its activation)."""
    from sentence_transformers.sentence_transformer.modules import Dense

    return Dense.load(str(path), local_files_only=True)


def _wrap(encoder: torch.nn.Module, dense: list[torch.nn.Module], head: Head) -> torch.nn.Module:
    """A module mapping (input_ids, attention_mask) to pooled, optionally normalized vectors."""
    import torch

    typed = "token_type_ids" in inspect.signature(encoder.forward).parameters

    class Embedder(torch.nn.Module):
        """Encoder, then the sentence-transformers pooling and dense layers, then L2
        normalization if asked."""

        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder
            self.dense = torch.nn.ModuleList(dense)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            """Embed one right-padded batch."""
            extra = {"token_type_ids": torch.zeros_like(input_ids)} if typed else {}
            hidden = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, **extra
            ).last_hidden_state
            modes = head.pooling.split("+")
            pooled = torch.cat([_pool(hidden, attention_mask, mode) for mode in modes], dim=-1)
            for layer in self.dense:
                pooled = layer({"sentence_embedding": pooled})["sentence_embedding"]
            if head.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=1)
            return pooled

    return Embedder().eval()  # eval() propagates to the encoder: no dropout


def _pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """One sentence-transformers pooling of right-padded token states (``Pooling.forward``)."""
    import torch

    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        return hidden[torch.arange(hidden.shape[0]), attention_mask.sum(dim=1) - 1]
    if mode == "max":
        return hidden.masked_fill(mask == 0, float("-inf")).max(dim=1).values
    if mode == "weightedmean":  # weights 1, 2, ... by position; right padding starts them at 1
        weights = torch.cumsum(mask, dim=1) * mask
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
    count = mask.sum(dim=1).clamp(min=1e-9)
    return (hidden * mask).sum(dim=1) / (count.sqrt() if mode == "mean_sqrt_len_tokens" else count)


def write_tokenizer(source: Path, path: Path, *, lowercase: bool = False) -> Tokenizer:
    """Save the source tokenizer with padding and truncation off (the worker pads per batch),
    lowercasing first if asked and it does not already (sentence-transformers' ``do_lower_case``,
    done the way it does it: a ``Lowercase`` normalizer before the tokenizer's own)."""
    from tokenizers import Tokenizer, normalizers

    if not source.is_file():
        raise BuildError("file not found", file="tokenizer.json")
    tokenizer = Tokenizer.from_file(str(source))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    current = json.loads(tokenizer.to_str()).get("normalizer")
    if lowercase and not _lowercases(current):
        first = normalizers.Lowercase()
        own = tokenizer.normalizer
        tokenizer.normalizer = normalizers.Sequence([first, own]) if own is not None else first
    tokenizer.save(str(path))
    return tokenizer


def _lowercases(normalizer: Any) -> bool:
    """A tokenizer.json ``normalizer`` that lowercases."""
    if not isinstance(normalizer, dict):
        return False
    kind = normalizer.get("type")
    if kind == "Sequence":
        return any(_lowercases(part) for part in normalizer.get("normalizers") or [])
    return kind == "Lowercase" or (kind == "BertNormalizer" and bool(normalizer.get("lowercase")))


def pad(
    tokenizer: Tokenizer, sentences: tuple[str, ...] | tuple[tuple[str, str], ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize and right-pad a batch (of texts, or of pairs) with id 0; return int64 ids and
    attention mask."""
    rows = [encoding.ids for encoding in tokenizer.encode_batch(list(sentences))]
    width = max(len(row) for row in rows)
    ids = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def export(embedder: torch.nn.Module, tokenizer: Tokenizer, dimensions: int, path: Path) -> None:
    """Trace to a single-file ONNX graph with dynamic batch and sequence axes."""
    import onnx
    import torch

    ids, mask = pad(tokenizer, EXPORT_SENTENCES)
    axes = {0: "batch", 1: "sequence"}
    with torch.inference_mode(), _indexed_masks():
        torch.onnx.export(
            embedder,
            (torch.from_numpy(ids), torch.from_numpy(mask)),
            str(path),
            input_names=["input_ids", "attention_mask"],
            output_names=["embeddings"],
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "embeddings": {0: "batch"}},
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    model = onnx.load(str(path))
    if any(path.parent.glob("*.data")) or any(t.data_location for t in model.graph.initializer):
        raise RuntimeError("export wrote external data; expected a single-file model")
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = dimensions
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


@contextlib.contextmanager
def _indexed_masks() -> Iterator[None]:
    """transformers builds a mask with ``or``/``and`` terms (EmbeddingGemma's bidirectional
    and windowed attention) through ``torch.vmap``, which tracing cannot follow; its terms are
    comparisons of broadcast indices, so they are built by broadcasting here, as transformers
    builds its own causal masks. (A term that is not would trace wrong: the accuracy check
    compares the graph with sentence-transformers.)"""
    from transformers import masking_utils

    made = masking_utils.sdpa_mask

    def broadcast(*args: Any, **kwargs: Any) -> Any:
        return made(*args, **{**kwargs, "use_vmap": False})

    masking_utils.sdpa_mask = broadcast
    try:
        yield
    finally:
        masking_utils.sdpa_mask = made


def optimize(path: Path, out: Path) -> None:
    """Portable graph clean-up (constant folding, redundant nodes): ONNX Runtime's basic level.

    The fusions of the higher levels are hardware-specific; the worker's compile step applies
    them per target (``_compile_cpu``), so the stored artifact stays good for every engine.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(out)
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def quantize_int8(path: Path, out: Path) -> None:
    """Dynamic int8 quantization of the weights (activations quantized per batch at run time)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(path), str(out), weight_type=QuantType.QInt8)
