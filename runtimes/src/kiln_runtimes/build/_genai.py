"""Generation folders: the onnxruntime-genai builder in its own process, tokenizer, manifest."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import msgspec

from kiln_runtimes.backends._genai_config import unfed
from kiln_runtimes.build._checks import TEMPLATE_NAME, chat_template, chat_templates
from kiln_runtimes.build._options import BuildError
from kiln_runtimes.build._source import read_json
from kiln_runtimes.protocol import BuildFailure, ModelManifest

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def builder_command(
    hf_dir: Path, out: Path, cache: Path, *, precision: str, target: str, prune_lm_head: bool
) -> list[str]:
    """The builder's own command line for one build (``_builder.main``'s ``argv``)."""
    command = ["-i", str(hf_dir), "-o", str(out), "-c", str(cache), "-p", precision, "-e", target]
    # Kiln's runner drives no draft head: a checkpoint's multi-token-prediction layers (Qwen
    # 3.5's) are left out, which pruning the LM head needs too.
    extra = ["exclude_mtp=true", *(["prune_lm_head=true"] if prune_lm_head else [])]
    return [*command, "--extra_options", *extra]


def run_builder(command: list[str], out: Path, log: Path) -> None:
    """Run the builder in a process of its own (it holds the whole model in memory, freed when
    it exits), forked from a server that imported it once (~5 s of imports), so a process that
    builds more than once pays them once; what it prints goes to ``log``."""
    # nothing from the network (all it needs is in the input folder); read at import, so set
    # before the fork server, which imports it, starts
    os.environ["HF_HUB_OFFLINE"] = "1"
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["kiln_runtimes.build._builder"])
    refused = log.with_suffix(".refused.json")  # where a mend's refusal comes back
    process = context.Process(target=_builder_main, args=(command, log, refused), name="builder")
    process.start()
    try:
        process.join()
    finally:  # a cancelled build (SIGTERM: SystemExit here) takes its builder with it
        if process.is_alive():
            process.kill()
            process.join()
    if process.exitcode == 2 and refused.is_file():  # a mend refused the input, naming it
        failure = msgspec.json.decode(refused.read_bytes(), type=BuildFailure)
        raise BuildError(failure.error, file=failure.file, field=failure.field)
    if process.exitcode != 0 or not (out / "genai_config.json").is_file():
        said = log.read_text(errors="replace").strip() if log.is_file() else ""
        cause = said.splitlines()[-1] if said else "no output"  # the exception, first
        raise RuntimeError(
            f"onnxruntime-genai builder failed ({process.exitcode}): {cause}\n{said[-4000:]}"
        )


def _builder_main(command: list[str], log: Path, refused: Path) -> None:
    """The builder process, its output to ``log``; input a mend refuses (a ``BuildError``:
    file, field) goes back in ``refused``, exit status 2."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    from kiln_runtimes.build import _builder

    try:
        _builder.main(command)
    except BuildError as exc:
        refused.write_bytes(msgspec.json.encode(exc.failure()))
        sys.exit(2)


def slide_every_layer(out: Path) -> int:
    """Give every attention node of the graph the sliding window the builder wrote in
    ``genai_config.json`` for all layers (``layers: []``: Mistral's, Phi-3's) but left out of
    the graph (``local_window_size`` -1), so no position attends further back than the window,
    as in transformers, and drop it from ``genai_config.json`` (GenAI would keep a cache of one
    window); return the window set (0: none). Windows per layer (Gemma 2's) are in the graph
    already, and a window no shorter than the context changes nothing."""
    import onnx

    genai = read_json(out / "genai_config.json")
    model_config = genai["model"]
    window = model_config["decoder"].get("sliding_window") or {}
    size = int(window.get("window_size") or 0)
    if not size or window.get("layers") or size >= int(model_config["context_length"]):
        return 0
    path = out / model_config["decoder"].get("filename", "model.onnx")
    graph = onnx.load(str(path), load_external_data=False)  # the weights file stays as it is
    nodes = [n for n in graph.graph.node if n.op_type == "GroupQueryAttention"]
    sizes = [a for n in nodes for a in n.attribute if a.name == "local_window_size"]
    if not nodes or len(sizes) != len(nodes) or any(a.i != -1 for a in sizes):
        raise BuildError(f"cannot set the sliding window of {size} on this graph's attention",
                         file="config.json", field="sliding_window")  # fmt: skip
    for attribute in sizes:
        attribute.i = size
    onnx.save(graph, str(path))
    # the graph holds the window now; GenAI's own cache for it would be one window long
    del model_config["decoder"]["sliding_window"]
    (out / "genai_config.json").write_text(json.dumps(genai, indent=4))
    return size


def copy_tokenizer(hf_dir: Path, out: Path) -> None:
    """Make sure the gateway's tokenizer files, with the default chat template inline and any
    named others as ``additional_chat_templates/<name>.jinja``, are in ``out``."""
    for name in TOKENIZER_FILES:
        if not (out / name).is_file():
            shutil.copy2(hf_dir / name, out / name)
    config = json.loads((out / "tokenizer_config.json").read_text())
    if not isinstance(config.get("chat_template"), str) or not config["chat_template"]:
        template = chat_template(hf_dir)
        if template is None:
            raise BuildError(
                "no chat template", file="tokenizer_config.json", field="chat_template"
            )
        config["chat_template"] = template
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    named = {k: v for k, v in chat_templates(hf_dir).items() if k != "default" and v}
    for name, text in named.items():  # as transformers saves them; the gateway reads tool_use
        if TEMPLATE_NAME.fullmatch(name):
            (out / "additional_chat_templates").mkdir(exist_ok=True)
            (out / "additional_chat_templates" / f"{name}.jinja").write_text(text)


def stop_token_ids(hf_dir: Path) -> list[int]:
    """``eos_token_id`` (an id or a list) of ``config.json`` and ``generation_config.json``."""
    ids: list[int] = []
    for name in ("config.json", "generation_config.json"):
        if (hf_dir / name).is_file():
            ids += _ids(read_json(hf_dir / name).get("eos_token_id"))
    return sorted(set(ids))


SAMPLING = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "top_k": (-1.0, float("inf")),
            "min_p": (0.0, 1.0), "repetition_penalty": (1e-9, 2.0)}  # fmt: skip
"""The sampling defaults a ``generation_config.json`` may give (vLLM's), and their ranges."""


def sampling_defaults(hf_dir: Path) -> dict[str, float]:
    """The model's own sampling defaults from ``generation_config.json``: what a request that
    leaves one out gets, as vLLM's ``--generation-config auto`` (a value out of range is not
    one)."""
    path = hf_dir / "generation_config.json"
    config = read_json(path) if path.is_file() else {}
    found = {}
    for key, (low, high) in SAMPLING.items():
        value = config.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and low <= value <= high:
            found[key] = float(value)
    most = config.get("max_new_tokens")
    if isinstance(most, int) and not isinstance(most, bool) and most >= 1:
        found["max_tokens"] = float(most)  # vLLM's name for it; a request without one gets it
    return found


def _ids(value: Any) -> list[int]:
    """A token id or list of ids from a config value; anything else is none."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def manifest(
    out: Path, *, name: str, source: str, architecture: str | None, precision: str | None,
    target: str | None, stop: list[int], sampling: dict[str, float] | None = None,
) -> ModelManifest:  # fmt: skip
    """Describe a generation folder; file and context length come from ``genai_config.json``."""
    genai = read_json(out / "genai_config.json")
    try:
        model = genai["model"]
        filename = model["decoder"].get("filename", "model.onnx")
        context = int(model["context_length"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BuildError(f"missing {exc}", file="genai_config.json", field="model") from exc
    if not stop:
        stop = _ids(model.get("eos_token_id"))
    return ModelManifest(
        name=name,
        task="generate",
        engine="onnxruntime-genai",
        model_file=filename,
        tokenizer_file="tokenizer.json",
        context_length=context,
        source=source,
        architecture=architecture,
        precision=precision,
        target=target or provider(genai),
        stop_token_ids=stop,
        sampling=sampling or {},
    )


def check_inputs(folder: Path) -> None:
    """Refuse a decoder Kiln's runner cannot feed (``_genai_config.unfed``), naming its inputs."""
    decoder = read_json(folder / "genai_config.json").get("model", {}).get("decoder", {})
    if why := unfed(decoder if isinstance(decoder, dict) else {}):
        raise BuildError(why, file="genai_config.json", field="model.decoder.inputs")


def provider(genai: dict[str, Any]) -> str:
    """``cuda`` when the session options name the CUDA provider, else ``cpu``."""
    options = genai.get("model", {}).get("decoder", {}).get("session_options", {})
    names = {key for entry in options.get("provider_options", []) for key in entry}
    return "cuda" if "cuda" in names else "cpu"


def check_prebuilt(folder: Path) -> None:
    """A prebuilt GenAI folder must name a decoder file it has, one Kiln's runner can feed
    (``_genai_config.unfed``), and carry a tokenizer."""
    genai = read_json(folder / "genai_config.json")
    decoder = genai.get("model", {}).get("decoder", {})
    filename = decoder.get("filename") if isinstance(decoder, dict) else None
    if not isinstance(filename, str):
        raise BuildError("no decoder file named", file="genai_config.json", field="model.decoder")
    if why := unfed(decoder):
        raise BuildError(why, file="genai_config.json", field="model.decoder.inputs")
    if not (folder / filename).is_file():
        raise BuildError("file not found (named by genai_config.json)", file=filename)
