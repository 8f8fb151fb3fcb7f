"""In-process engines for ``bench/llm.py``, each in its own child process (no HTTP, no gateway).

    python bench/_llm_inproc.py MODE MODEL_DIR [--threads N]

MODE: ``ort-generator`` (onnxruntime-genai's batched ``og.Generator``: static batches of
``streams`` rows, the fastest og path on CPU per the engine author's findings), ``ort-engine``
(``og.Engine``, continuous requests), ``kiln-engine`` (Kiln's ``GenAIGenerationBackend`` driven
directly, the worker without HTTP or gateway). The model loads once; then each JSON line on stdin
``{"streams", "warmup", "duration", "max_tokens", "first"}`` (``first``: number of the first
request, as in ``_llm_load.closed_loop``) runs one closed-loop measurement and
answers one JSON line: the window and per-request records, times in seconds from the run's start.
``{"quit": true}`` or EOF ends the process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _llm_load import render

Record = dict[str, Any]


class Tokens:
    """Prompt ids (SmolLM2's tokenizer; the chat template is already in the rendered text)."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def ids(self, i: int) -> list[int]:
        return self._tok.encode(render(i), add_special_tokens=False).ids


def _eos(model_dir: Path) -> set[int]:
    eos = json.loads((model_dir / "genai_config.json").read_text())["model"]["eos_token_id"]
    return set(eos if isinstance(eos, list) else [eos])


def _og_model(model_dir: Path, threads: int) -> tuple[Any, Any]:
    import onnxruntime_genai as og

    config = og.Config(str(model_dir))
    options: dict[str, Any] = {"intra_op_num_threads": threads} if threads else {}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    return og, og.Model(config)


class OrtGenerator:
    """Closed loop over static batches: ``streams`` prompts prefilled together, decoded together.

    A row that hits EOS stops counting but its row keeps running until the whole batch is done
    (``og.Generator`` cannot drop or add rows); then the next batch of prompts starts.
    """

    def __init__(self, model_dir: Path, threads: int) -> None:
        self.og, self.model = _og_model(model_dir, threads)
        self.tokens = Tokens(model_dir)
        self.eos = _eos(model_dir)
        self.pad = json.loads((model_dir / "genai_config.json").read_text())["model"].get(
            "pad_token_id", min(self.eos)
        )
        self._batch(0, 2, 4, time.perf_counter())  # warm-up

    def _batch(self, first: int, n: int, max_tokens: int, t0: float) -> list[Record]:
        import numpy as np

        og = self.og
        prompts = [self.tokens.ids(first + k) for k in range(n)]
        width = max(map(len, prompts))
        block = np.full((n, width), self.pad, dtype=np.int32)
        for k, p in enumerate(prompts):
            # Left padding, as batched generation is usually done. Measured with og 0.18: right
            # padding corrupts the shorter rows (pads inside the sequence: degenerate output),
            # left padding gives coherent text that differs a little from a solo run.
            block[k, width - len(p) :] = p
        params = og.GeneratorParams(self.model)
        params.set_search_options(batch_size=n, max_length=width + max_tokens, do_sample=False)
        sent = time.perf_counter() - t0
        gen = og.Generator(self.model, params)
        gen.append_tokens(block)
        recs: list[Record] = [
            {"sent": sent, "chunks": [], "prompt_tokens": len(p), "done": True} for p in prompts
        ]
        live = [True] * n
        steps = 0
        while not gen.is_done() and steps < max_tokens and any(live):
            gen.generate_next_token()
            tokens = gen.get_next_tokens()
            t = time.perf_counter() - t0
            steps += 1
            for k in range(n):
                if live[k]:
                    if int(tokens[k]) in self.eos:
                        live[k] = False
                    else:
                        recs[k]["chunks"].append([t, 1])
        return recs

    def run(
        self, streams: int, warmup: float, duration: float, max_tokens: int, first: int = 0
    ) -> list[Record]:
        t0 = time.perf_counter()
        end = warmup + duration
        recs: list[Record] = []
        while time.perf_counter() - t0 < end:
            recs += self._batch(first, streams, max_tokens, t0)
            first += streams
        return recs


class OrtEngine:
    """Closed loop on ``og.Engine``: ``streams`` requests in flight, a finished one is replaced."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        self.og, self.model = _og_model(model_dir, threads)
        self.tokens = Tokens(model_dir)
        self.eos = _eos(model_dir)
        self.engine = self.og.Engine(self.model)
        self.buffer = self.engine.create_event_buffer(1024)
        self.run(1, 0.0, 0.01, 4)  # warm-up (raises here if the folder cannot run on og.Engine)

    def _add(self, i: int, max_tokens: int) -> Any:
        import numpy as np

        og = self.og
        request = self.engine.create_request()
        turn = og.TurnOptions(request)
        turn.set_temperature(0.0)
        turn.set_max_generated_tokens(max_tokens)
        request.begin_turn(np.asarray(self.tokens.ids(i), dtype=np.int32), turn)
        return request

    def run(
        self, streams: int, warmup: float, duration: float, max_tokens: int, first: int = 0
    ) -> list[Record]:
        og = self.og
        t0 = time.perf_counter()
        end = warmup + duration
        live: dict[int, tuple[Any, Record]] = {}
        recs: list[Record] = []
        nxt = first

        def add() -> None:
            nonlocal nxt
            rec: Record = {"sent": time.perf_counter() - t0, "chunks": [], "done": False}
            request = self._add(nxt, max_tokens)
            rec["prompt_tokens"] = len(self.tokens.ids(nxt))
            nxt += 1
            live[id(request)] = (request, rec)
            recs.append(rec)

        for _ in range(streams):
            add()
        while live:
            events = self.engine.run(self.buffer)
            t = time.perf_counter() - t0
            for ev in events:
                entry = live.get(id(ev.request)) if ev.request is not None else None
                if entry is None:
                    continue
                request, rec = entry
                if ev.token is not None and ev.token >= 0 and int(ev.token) not in self.eos:
                    rec["chunks"].append([t, 1])
                if ev.finish_reason != og.FinishReason.NONE:
                    rec["done"] = True
                    del live[id(request)]
                    if t < end:
                        add()
        return recs


class KilnEngine:
    """Kiln's ``GenAIGenerationBackend`` as the worker configures it, streams as asyncio tasks."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        import msgspec

        from kiln_runtimes import backends
        from kiln_runtimes.backends.base import EngineOptions
        from kiln_runtimes.backends.genai import GenAIGenerationBackend
        from kiln_runtimes.protocol import ModelManifest

        self.tokens = Tokens(model_dir)
        self.eos = sorted(_eos(model_dir))
        self.loop = asyncio.new_event_loop()
        self.backend = GenAIGenerationBackend(EngineOptions(threads=threads, max_batch_size=32))
        manifest = msgspec.json.decode((model_dir / "kiln.json").read_bytes(), type=ModelManifest)
        start = backends.start(self.backend, model_dir, manifest, None)
        self.loop.run_until_complete(start)
        self.run(1, 0.0, 0.01, 4)

    def run(
        self, streams: int, warmup: float, duration: float, max_tokens: int, first: int = 0
    ) -> list[Record]:
        run = self._run(streams, warmup + duration, max_tokens, first)
        return self.loop.run_until_complete(run)

    async def _run(self, streams: int, end: float, max_tokens: int, first: int) -> list[Record]:
        from kiln_runtimes.protocol import GenerateRequest

        t0 = time.perf_counter()
        recs: list[Record] = []

        async def client(k: int) -> None:
            i = first + k
            while time.perf_counter() - t0 < end:
                ids = self.tokens.ids(i)
                rec: Record = {"sent": time.perf_counter() - t0, "chunks": [], "done": False}
                rec["prompt_tokens"] = len(ids)
                recs.append(rec)
                request = GenerateRequest(
                    request_id=f"b{i}", prompt_ids=ids, max_tokens=max_tokens,
                    temperature=0.0, stop_token_ids=self.eos,
                )  # fmt: skip
                async for chunk in self.backend.stream(request):
                    if chunk.token_ids:
                        rec["chunks"].append([time.perf_counter() - t0, len(chunk.token_ids)])
                rec["done"] = True
                i += streams

        await asyncio.gather(*(client(k) for k in range(streams)))
        return recs


MODES: dict[str, Any] = {
    "ort-generator": OrtGenerator,
    "ort-engine": OrtEngine,
    "kiln-engine": KilnEngine,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    out = sys.stdout
    sys.stdout = sys.stderr  # library chatter must not corrupt the protocol
    try:
        runner = MODES[args.mode](args.model_dir, args.threads)
    except Exception as exc:  # reported to the parent, which skips the system
        out.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}) + "\n")
        out.flush()
        return
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        warmup, duration = float(cmd["warmup"]), float(cmd["duration"])
        try:
            recs = runner.run(
                int(cmd["streams"]), warmup, duration, int(cmd["max_tokens"]), int(cmd["first"])
            )
            reply: dict[str, Any] = {"window": [warmup, warmup + duration], "records": recs}
        except Exception as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
