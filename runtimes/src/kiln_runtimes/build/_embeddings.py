"""Embeddings builds: a sentence-transformers (or bare BERT-family) folder to one ONNX graph;
a sequence classifier (a cross-encoder of one label, a classifier of more) to its graph of
probabilities."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from kiln_runtimes.build import _checks, _encoder, _scorer
from kiln_runtimes.build._options import BuildError, check_memory
from kiln_runtimes.build._pooling import Head, matryoshka, read_head
from kiln_runtimes.build._source import classes, read_json
from kiln_runtimes.protocol import ModelManifest

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from tokenizers import Tokenizer

    from kiln_runtimes.accuracy import AccuracyReport, ClassAccuracy, EmbedAccuracy, ScoreAccuracy
    from kiln_runtimes.build._options import BuildOptions
    from kiln_runtimes.build._source import Source
    from kiln_runtimes.protocol import BuildPhase

MODEL_FILE = "model.onnx"
EMBED_PRECISIONS = ("fp32", "int8")


def build_embeddings(
    found: Source, folder: Path, work: Path, options: BuildOptions,
    say: Callable[[BuildPhase, int, str], None],
) -> tuple[ModelManifest, AccuracyReport]:  # fmt: skip
    """Export, optimize, optionally quantize, then compare with the source's framework."""
    source = Path(found.path)
    precision = options.precision or "fp32"
    if precision not in EMBED_PRECISIONS:
        raise BuildError(
            f"embeddings build in {' or '.join(EMBED_PRECISIONS)}, not {precision}",
            field="precision",
        )
    labels = classes(read_json(source / "config.json"))
    head = Head() if labels else read_head(source)
    encoder_dir = source / head.encoder_dir
    _checks.check_tokenizer(encoder_dir, chat=False)
    parameters = _checks.weight_parameters(encoder_dir)
    check_memory(parameters, precision, options.max_memory_bytes, found.path)
    what = {0: f"with {head.pooling} pooling", 1: "as a cross-encoder"}
    say("converting", 20, f"exporting {found.architecture} {what.get(labels, 'as a classifier')}")
    tokenizer = _encoder.write_tokenizer(
        encoder_dir / "tokenizer.json", folder / "tokenizer.json", lowercase=head.lowercase
    )
    embedder, dimensions, positions, names = _graph(source, head, tokenizer, labels)
    cuts = None if labels else matryoshka(read_json(encoder_dir / "config.json"), dimensions)
    _encoder.export(embedder, tokenizer, dimensions, work / "exported.onnx")
    say("optimizing", 50, "ONNX Runtime basic graph optimizations")
    _encoder.optimize(work / "exported.onnx", work / "optimized.onnx")
    if precision == "int8":
        say("quantizing", 65, "dynamic int8 weights")
        _encoder.quantize_int8(work / "optimized.onnx", folder / MODEL_FILE)
    else:
        shutil.copy2(work / "optimized.onnx", folder / MODEL_FILE)
    manifest = ModelManifest(
        name=options.name or source.name.lower(),
        task="embeddings",
        engine="onnxruntime",
        model_file=MODEL_FILE,
        tokenizer_file="tokenizer.json",
        context_length=positions,
        dimensions=dimensions,
        source=options.source_label or found.path,
        architecture=found.architecture,
        precision=precision,
        target=options.target,
        pooling=None if labels else head.pooling,
        normalize=None if labels else head.normalize,
        matryoshka_dimensions=cuts,
        prompts=head.prompts,
        default_prompt_name=head.default_prompt_name,
        scores=labels == 1,
        labels=names,
    )
    prompt = head.prompts.get(head.default_prompt_name or "", "")
    return manifest, _checked(source, folder, labels, precision, say, prompt=prompt)


def _checked(
    source: Path, folder: Path, labels: int, precision: str,
    say: Callable[[BuildPhase, int, str], None], *, prompt: str,
) -> EmbedAccuracy | ScoreAccuracy | ClassAccuracy:  # fmt: skip
    """The build against its source framework (texts with the default ``prompt``); an fp32
    graph that answers unlike it fails."""
    from kiln_runtimes.build import _accuracy

    report: EmbedAccuracy | ScoreAccuracy | ClassAccuracy
    if labels == 1:
        say("checking accuracy", 80, "pair scores against sentence-transformers' CrossEncoder")
        report = _accuracy.scores(source, folder, MODEL_FILE)
    elif labels:
        say("checking accuracy", 80, "probabilities against transformers' pipeline")
        report = _accuracy.classes(source, folder, MODEL_FILE)
    else:
        say("checking accuracy", 80, "cosine against sentence-transformers")
        report = _accuracy.embeddings(source, folder, MODEL_FILE, prompt)
    _accuracy.faithful(report, precision)
    return report


def _graph(
    source: Path, head: Head, tokenizer: Tokenizer, labels: int
) -> tuple[torch.nn.Module, int, int, list[str]]:
    """The module to export, its output's width, its position limit and a classifier's labels
    (none for a cross-encoder or an embeddings model)."""
    if not labels:
        return (*_encoder.load(source, head), [])
    made = _scorer.load(source, _scorer.separator(source, tokenizer, required=labels == 1))
    names = made.labels if len(made.labels) > 1 else []
    return made.module, len(made.labels), made.positions, names
