"""Each build against its source framework on fixed inputs (the ``accuracy.json`` report)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from kiln_runtimes.accuracy import ClassAccuracy, EmbedAccuracy, GenerateAccuracy, ScoreAccuracy
from kiln_runtimes.build._options import BuildError
from kiln_runtimes.build._source import first_architecture, read_json

if TYPE_CHECKING:
    from pathlib import Path

FP32_MIN_COSINE = 0.999
"""An fp32 encoder graph is the source's arithmetic: a lower cosine means a wrong conversion."""
FP32_MAX_DIFF = 1e-3
"""The same for an fp32 cross-encoder's scores or a classifier's probabilities."""
FP32_MAX_LOGIT_DIFF = 0.1
"""The same for an fp32 generation build's logits: right conversions measure 2e-5 to 7e-3
(tiny models of every architecture; SmolLM2-135M 6e-5), wrong ones 1 and more."""
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
SENTENCES = (
    "a cat sits on the mat",
    "Kiln compares every build with the framework it came from.",
    "Café crème, s'il vous plaît",
    "the the the the",
)


def agreement(reference: list[int], built: list[int]) -> tuple[int, int | None]:
    """Equal-prefix length of two greedy outputs and the first index where they differ."""
    prefix = 0
    for want, got in zip(reference, built, strict=False):
        if want != got:
            break
        prefix += 1
    same = prefix == len(reference) == len(built)
    return prefix, None if same else prefix


def teacher_forced(reference: np.ndarray, built: np.ndarray) -> tuple[float, float, float]:
    """Top-1 agreement rate and max abs difference of two ``[positions, vocab]`` logit arrays,
    and the smallest gap between the reference's best and second-best logit at any position."""
    rate = float(np.mean(reference.argmax(axis=-1) == built.argmax(axis=-1)))
    top2 = np.sort(reference, axis=-1)[:, -2:].astype(np.float64)
    margin = float((top2[:, 1] - top2[:, 0]).min())
    return rate, float(np.abs(reference.astype(np.float64) - built).max()), margin


def cosines(reference: np.ndarray, built: np.ndarray) -> list[float]:
    """Cosine similarity of each row pair."""
    a, b = reference.astype(np.float64), built.astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return [float(x) for x in (a * b).sum(axis=1) / np.maximum(norms, 1e-12)]


def generate(hf_dir: Path, built_dir: Path, tokens: int) -> GenerateAccuracy:
    """Greedy ``tokens`` tokens from transformers and from the built folder, then both scored
    teacher-forced on transformers' sequence."""
    from tokenizers import Tokenizer

    prompt = Tokenizer.from_file(str(built_dir / "tokenizer.json")).encode(PROMPT).ids
    reference, reference_logits = _transformers(hf_dir, prompt, tokens)
    built, built_logits = _genai(built_dir, prompt, reference, tokens)
    prefix, divergence = agreement(reference, built)
    rate, diff, margin = teacher_forced(reference_logits, built_logits)
    return GenerateAccuracy(
        prompt_ids=prompt, tokens=tokens, reference_ids=reference, built_ids=built,
        equal_prefix=prefix, first_divergence=divergence, top1_agreement=rate,
        max_abs_logit_diff=diff, reference_min_margin=margin,
    )  # fmt: skip


def _transformers(hf_dir: Path, prompt: list[int], tokens: int) -> tuple[list[int], np.ndarray]:
    """transformers' greedy continuation (EOS ignored) and its logits along it, fp32."""
    import torch
    import transformers

    architecture = first_architecture(read_json(hf_dir / "config.json")) or ""
    auto = "ImageTextToText" if architecture.endswith("ForConditionalGeneration") else "CausalLM"
    loader = getattr(transformers, f"AutoModelFor{auto}")  # a vision model's text: ids only
    model = loader.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None  # generate merges it in: never stop early
    settings = transformers.GenerationConfig(
        do_sample=False, max_new_tokens=tokens, eos_token_id=None,
        pad_token_id=0, bos_token_id=None,
    )  # fmt: skip
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=settings)
        sequence = out[0, len(prompt) :].tolist()
        logits = model(out[:, :-1]).logits[0, len(prompt) - 1 :].float().numpy()
    return sequence, logits


def _genai(
    built_dir: Path, prompt: list[int], reference: list[int], tokens: int
) -> tuple[list[int], np.ndarray]:
    """The built folder's own greedy continuation, and its logits along ``reference``."""
    import onnxruntime_genai as og

    model = og.Model(str(built_dir))
    model_config = read_json(built_dir / "genai_config.json")["model"]
    window = (model_config["decoder"].get("sliding_window") or {}).get("window_size", 0)
    # GenAI keeps a cache of one window at least for a window its genai_config names (Gemma 2's)
    least = min(int(window), int(model_config["context_length"]))
    own = _step(og, model, prompt, None, tokens, least=least)
    forced = _step(og, model, prompt, reference, len(reference), least=least)
    return [int(np.argmax(row)) for row in own][:tokens], np.stack(forced)


def _step(
    og: Any, model: Any, prompt: list[int], forced: list[int] | None, tokens: int, *, least: int
) -> list[np.ndarray]:
    """Last-position logits after the prompt and after each appended token (argmax or forced),
    in a cache of ``least`` positions or more."""
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max(len(prompt) + tokens + 1, least), do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    rows: list[np.ndarray] = []
    for i in range(tokens):
        row = np.asarray(generator.get_logits(), dtype=np.float32).reshape(-1)
        rows.append(row)
        if i + 1 < tokens:
            nxt = forced[i] if forced is not None else int(np.argmax(row))
            generator.append_tokens([nxt])
    return rows


def embeddings(source: Path, built_dir: Path, model_file: str, prompt: str = "") -> EmbedAccuracy:
    """Cosine of each fixed input's built embedding with sentence-transformers' own: the
    framework prefixes its default prompt itself, the built graph gets ``prompt`` + text (as
    the gateway sends it), so a misread prompt shows."""
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    from kiln_runtimes.build._encoder import pad

    reference = SentenceTransformer(str(source), device="cpu", local_files_only=True).encode(
        list(SENTENCES), convert_to_numpy=True
    )
    texts = tuple(prompt + text for text in SENTENCES)
    ids, mask = pad(Tokenizer.from_file(str(built_dir / "tokenizer.json")), texts)
    session = ort.InferenceSession(str(built_dir / model_file), providers=["CPUExecutionProvider"])
    built = session.run(["embeddings"], {"input_ids": ids, "attention_mask": mask})[0]
    values = cosines(np.asarray(reference), built)
    return EmbedAccuracy(inputs=list(SENTENCES), cosines=values, min_cosine=min(values))


PAIRS = (
    ("a cat sits on the mat", "a kitten rests on the rug"),
    ("a cat sits on the mat", "stock prices fell sharply"),
    ("How is a build checked?", "Kiln compares every build with the framework it came from."),
    ("Café crème", "the the the the"),
)


def scores(source: Path, built_dir: Path, model_file: str) -> ScoreAccuracy:
    """Each fixed pair's score by sentence-transformers' ``CrossEncoder`` and by the build."""
    import onnxruntime as ort
    from sentence_transformers import CrossEncoder
    from tokenizers import Tokenizer

    from kiln_runtimes.build._encoder import pad

    reference = CrossEncoder(str(source), device="cpu", local_files_only=True).predict(
        [list(pair) for pair in PAIRS], convert_to_numpy=True
    )
    ids, mask = pad(Tokenizer.from_file(str(built_dir / "tokenizer.json")), PAIRS)
    session = ort.InferenceSession(str(built_dir / model_file), providers=["CPUExecutionProvider"])
    built = session.run(["embeddings"], {"input_ids": ids, "attention_mask": mask})[0][:, 0]
    want = np.asarray(reference, dtype=np.float64).reshape(-1)
    return ScoreAccuracy(
        pairs=[list(pair) for pair in PAIRS], reference=[float(x) for x in want],
        built=[float(x) for x in built], max_abs_diff=float(np.abs(want - built).max()),
    )  # fmt: skip


def classes(source: Path, built_dir: Path, model_file: str) -> ClassAccuracy:
    """Each fixed input's probabilities by transformers' text-classification pipeline (its own
    choice of softmax or sigmoid) and by the build, columns in the label order."""
    import onnxruntime as ort
    from tokenizers import Tokenizer
    from transformers import pipeline

    from kiln_runtimes.build._encoder import pad

    classify = pipeline("text-classification", model=str(source), device="cpu", top_k=None)
    config: Any = classify.model.config
    labels = [config.id2label[i] for i in range(config.num_labels)]
    answers: Any = classify(list(SENTENCES))
    want = np.array([[next(a["score"] for a in row if a["label"] == label) for label in labels]
                     for row in answers], dtype=np.float64)  # fmt: skip
    ids, mask = pad(Tokenizer.from_file(str(built_dir / "tokenizer.json")), SENTENCES)
    session = ort.InferenceSession(str(built_dir / model_file), providers=["CPUExecutionProvider"])
    built = session.run(["embeddings"], {"input_ids": ids, "attention_mask": mask})[0]
    return ClassAccuracy(
        inputs=list(SENTENCES), reference=want.tolist(), built=built.astype(np.float64).tolist(),
        max_abs_diff=float(np.abs(want - built).max()),
        top1_agreement=float(np.mean(want.argmax(axis=1) == built.argmax(axis=1))),
    )  # fmt: skip


def faithful(
    report: EmbedAccuracy | ScoreAccuracy | ClassAccuracy | GenerateAccuracy, precision: str
) -> None:
    """Refuse an fp32 build that does not answer like its source: a conversion that went wrong
    (int8's and int4's loss is the operator's choice, reported and served)."""
    if precision != "fp32":
        return
    if isinstance(report, EmbedAccuracy):
        if report.min_cosine < FP32_MIN_COSINE:
            _unlike(f"min cosine {report.min_cosine:.6f} to sentence-transformers "
                    f"(at least {FP32_MIN_COSINE})")  # fmt: skip
    elif isinstance(report, GenerateAccuracy):
        if not report.max_abs_logit_diff <= FP32_MAX_LOGIT_DIFF:  # NaN too
            _unlike(f"max logit difference {report.max_abs_logit_diff:.3g} to transformers, "
                    f"top-1 agreement {report.top1_agreement:.2f} "
                    f"(at most {FP32_MAX_LOGIT_DIFF})")  # fmt: skip
    elif report.max_abs_diff > FP32_MAX_DIFF:
        _unlike(f"max difference {report.max_abs_diff:.3g} (at most {FP32_MAX_DIFF})")


def _unlike(figures: str) -> None:
    raise BuildError(
        f"the fp32 graph answers unlike its source: {figures}", file="config.json",
        field="architectures",
    )  # fmt: skip
