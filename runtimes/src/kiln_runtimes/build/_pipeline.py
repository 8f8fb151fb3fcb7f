"""One build, start to finish: staged beside ``out_dir``, moved into place only when done."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from kiln_runtimes.accuracy import AccuracyReport, AccuracySkipped
from kiln_runtimes.build import _checks, _genai
from kiln_runtimes.build._options import (
    BuildError,
    BuildOptions,
    check_generate_precision,
    check_memory,
)
from kiln_runtimes.build._source import Source, detect, first_architecture, read_json
from kiln_runtimes.protocol import (
    GENERATE_PRECISION,
    MANIFEST_NAME,
    BuildPhase,
    BuildProgress,
    BuildReport,
    ModelManifest,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    Progress = Callable[[BuildProgress], None]
    Say = Callable[[BuildPhase, int, str], None]

ACCURACY_NAME = "accuracy.json"


def build(
    source: Path, out_dir: Path, options: BuildOptions | None = None,
    progress: Progress | None = None,
) -> BuildReport:  # fmt: skip
    """Build ``source`` into ``out_dir`` (replacing it); nothing is left behind on failure."""
    options = options or BuildOptions()
    say = _reporter(progress)
    started = time.monotonic()
    say("validating", 0, f"inspecting {source}")
    found = detect(Path(source), options.task)
    if found.kind == "tensor":
        raise BuildError(
            "an ONNX tensor model: upload it as a tensor model, it needs no build",
            file=Path(source).name,
            field="task",
        )
    out_dir = Path(out_dir).absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out_dir.name}.build-", dir=out_dir.parent) as tmp:
        work = Path(tmp)
        folder = work / "model"
        folder.mkdir()
        manifest, accuracy = _STEPS[found.kind](found, folder, work, options, say)
        (folder / MANIFEST_NAME).write_bytes(msgspec.json.encode(manifest))
        (folder / ACCURACY_NAME).write_bytes(msgspec.json.format(msgspec.json.encode(accuracy)))
        _replace_dir(folder, out_dir)
    say("ready", 100, f"built {out_dir}")
    return BuildReport(
        out_dir=str(out_dir), manifest=manifest, accuracy=accuracy,
        seconds=round(time.monotonic() - started, 2),
    )  # fmt: skip


def _reporter(progress: Progress | None) -> Say:
    """A ``say(phase, percent, message)`` that forwards to ``progress``."""

    def say(phase: BuildPhase, percent: int, message: str) -> None:
        if progress is not None:
            progress(BuildProgress(phase=phase, percent=percent, message=message))

    return say


def _name(found: Source, options: BuildOptions) -> str:
    """The model's name: asked for, else the source's file or folder name."""
    return options.name or Path(found.path).stem.lower()


def _hf_generate(
    found: Source, folder: Path, work: Path, options: BuildOptions,
    say: Say, *, hf_dir: Path | None = None,
) -> tuple[ModelManifest, AccuracyReport]:  # fmt: skip
    """A Hugging Face folder (given, or converted from GGUF) through the builder."""
    from kiln_runtimes.build import _accuracy

    hf = hf_dir or Path(found.path)
    precision = options.precision or GENERATE_PRECISION
    check_generate_precision(precision, options.target)
    architecture = _checks.check_architecture(first_architecture(read_json(hf / "config.json")))
    _checks.check_tokenizer(hf, chat=True)
    if hf_dir is None:
        check_memory(_checks.weight_parameters(hf), precision, options.max_memory_bytes, found.path)
    phase: BuildPhase = "quantizing" if precision in ("int4", "int8") else "converting"
    say(phase, 30, f"onnxruntime-genai builder: {architecture}, {precision}, {options.target}")
    command = _genai.builder_command(
        hf, folder, work / "cache", precision=precision, target=options.target,
        prune_lm_head=options.prune_lm_head,
    )  # fmt: skip
    _genai.run_builder(command, folder, work / "builder.log")
    _genai.check_inputs(folder)
    window = _genai.slide_every_layer(folder)
    slid = f"; a sliding window of {window} positions on every layer" if window else ""
    say("optimizing", 70, f"tokenizer, chat template and stop tokens{slid}")
    _genai.copy_tokenizer(hf, folder)
    manifest = _genai.manifest(
        folder, name=_name(found, options), source=options.source_label or found.path,
        architecture=architecture, precision=precision, target=options.target,
        stop=_genai.stop_token_ids(hf), sampling=_genai.sampling_defaults(hf),
    )  # fmt: skip
    if options.target != "cpu":
        return manifest, AccuracySkipped(reason=f"a {options.target} graph needs a GPU to run")
    say("checking accuracy", 80, f"greedy and teacher-forced, {options.accuracy_tokens} tokens")
    report = _accuracy.generate(hf, folder, options.accuracy_tokens)
    _accuracy.faithful(report, precision)
    return manifest, report


def _gguf(
    found: Source, folder: Path, work: Path, options: BuildOptions,
    say: Say,
) -> tuple[ModelManifest, AccuracyReport]:  # fmt: skip
    """A GGUF file: checked, dequantized by transformers, then the Hugging Face path."""
    from kiln_runtimes.build import _gguf

    path = Path(found.path)
    precision = options.precision or GENERATE_PRECISION
    check_generate_precision(precision, options.target)
    parameters = _gguf.inspect(path)
    check_memory(parameters, precision, options.max_memory_bytes, path.name)
    say("converting", 10, f"dequantizing {path.name} with transformers")
    hf_dir = work / "hf"
    _gguf.to_hf(path, hf_dir)
    return _hf_generate(found, folder, work, options, say, hf_dir=hf_dir)


def _hf(
    found: Source, folder: Path, work: Path, options: BuildOptions,
    say: Say,
) -> tuple[ModelManifest, AccuracyReport]:  # fmt: skip
    """A Hugging Face folder, by task."""
    if found.task == "generate":
        return _hf_generate(found, folder, work, options, say)
    from kiln_runtimes.build._embeddings import build_embeddings

    return build_embeddings(found, folder, work, options, say)


def _prebuilt(
    found: Source, folder: Path, work: Path, options: BuildOptions,
    say: Say,
) -> tuple[ModelManifest, AccuracyReport]:  # fmt: skip
    """A prebuilt ONNX Runtime GenAI folder: checked and copied as it is, but for a sliding
    window its ``genai_config.json`` names for every layer and its graph leaves out, set on the
    graph's attention as a build sets it (:func:`_genai.slide_every_layer`): Kiln's workers
    keep the whole context, so without it every position would be attended."""
    del work
    source = Path(found.path)
    _genai.check_prebuilt(source)
    _checks.check_tokenizer(source, chat=True)
    say("converting", 30, "copying the prebuilt folder")
    shutil.copytree(source, folder, dirs_exist_ok=True)
    (folder / MANIFEST_NAME).unlink(missing_ok=True)
    try:
        if window := _genai.slide_every_layer(folder):
            say("optimizing", 60, f"a sliding window of {window} positions on every layer")
    except BuildError as exc:  # attention that cannot take it: served as it was before
        say("optimizing", 60, f"the sliding window is left as it was: {exc}")
    architecture = None
    if (source / "config.json").is_file():
        architecture = first_architecture(read_json(source / "config.json"))
    manifest = _genai.manifest(
        folder, name=_name(found, options), source=options.source_label or found.path,
        architecture=architecture, precision=options.precision, target=None,
        stop=_genai.stop_token_ids(source), sampling=_genai.sampling_defaults(source),
    )  # fmt: skip
    return manifest, AccuracySkipped(reason="a prebuilt folder: no source framework to compare")


_STEPS = {"hf": _hf, "gguf": _gguf, "genai": _prebuilt}


def _replace_dir(built: Path, out_dir: Path) -> None:
    """Move the finished folder into place, replacing any previous build."""
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out_dir.rename(old)
        built.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        built.rename(out_dir)
