"""How long the gateway's CPU work on one request body holds the event loop (docs/benchmarks.md).

Times, in process, each step between reading a body and dispatching it, on bodies as large as
the default limits allow (``KILN_MAX_JSON_BODY_BYTES`` 4 MiB for ``/v1``,
``KILN_MAX_TENSOR_BODY_BYTES`` 256 MiB for ``/v2``) and on the small requests of the hot path:

- ``/v1`` JSON: Litestar's untyped decode plus ``msgspec.convert`` into the request struct;
- embeddings tokenizing (``tokenize_input``), chat templating + tokenizing (``chat_prompt``)
  with SmolLM2's tokenizer (from the e2e model cache): a max-context prompt, a limit-sized one;
- ``/v2``: ``oip_codec.parse`` of JSON and binary tensor bodies.

Per step (median of ``--runs``): ``inline`` is the time the step takes, all of it a stall when
it runs on the loop; ``threaded`` is the longest the loop went unserved (a task ticking every
0.5 ms) while the step ran in a thread instead. Steps that release the GIL (``tokenizers``'
batch calls) or are pure Python (Jinja) drop to a few ms; msgspec and numpy hold the GIL, so a
thread does not help them. The gateway moves the text steps to a thread past
``gateway._offload.INLINE_CHARS`` characters.

    python bench/loop_stalls.py            # about a minute
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from litestar.serialization import decode_json

from kiln_platform.gateway import llm, oip_codec
from kiln_platform.gateway._textmodel import load_text_model
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest
from kiln_platform.gateway.schemas import EmbeddingsRequest
from kiln_platform.gateway.services import tokenize_input

JSON_LIMIT = 4 << 20
TENSOR_LIMIT = 256 << 20
CACHE = Path(os.environ.get("KILN_TEST_CACHE") or Path.home() / ".cache" / "kiln-test")
WORDS = "the scheduler keeps one queue per pool and shares capacity fairly across tenants "


def text(chars: int) -> str:
    """English-like text of ``chars`` characters."""
    return (WORDS * (chars // len(WORDS) + 1))[:chars]


def inline_ms(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


async def _threaded(fn: Any) -> float:
    """The longest the loop went unserved (ms) while ``fn`` ran in a thread."""
    worst, running = 0.0, True

    async def tick() -> None:
        nonlocal worst
        last = time.perf_counter()
        while running:
            await asyncio.sleep(0.0005)
            now = time.perf_counter()
            worst, last = max(worst, now - last), now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    await asyncio.to_thread(fn)
    running = False
    await ticker
    return worst * 1000


def threaded_ms(fn: Any) -> float:
    return asyncio.run(_threaded(fn))


def v1_json(body: bytes) -> Any:
    """What Litestar does with a ``data: EmbeddingsRequest`` body: untyped decode, convert."""
    return msgspec.convert(decode_json(body), EmbeddingsRequest, strict=False)


def steps() -> list[tuple[str, int, Any]]:
    rows: list[tuple[str, int, Any]] = []
    bodies = {
        "1 sentence": {"model": "m", "input": "a cat sits on the mat"},
        "2040 x 2000 chars": {"model": "m", "input": [text(2000) for _ in range(2040)]},
        "2040 x 330 token ids": {"model": "m", "input": [[1234] * 330 for _ in range(2040)]},
    }
    for name, value in bodies.items():
        body = json.dumps(value).encode()
        rows.append((f"/v1/embeddings decode, {name}", len(body), lambda b=body: v1_json(b)))
    model = load_text_model(CACHE / "smollm2-0.1.2", "tokenizer.json")
    for name, raw in (("1 sentence", "a cat sits on the mat"),
                      ("2040 x 2000 chars", [text(2000) for _ in range(2040)])):  # fmt: skip
        rows.append((f"embeddings tokenize, {name}", len(json.dumps(raw)),
                     lambda r=raw: tokenize_input(r, model.tokenizer, 1 << 30)))  # fmt: skip
    for name, chars in (("short", 200), ("8192-token", 8192 * 4), ("4 MiB", JSON_LIMIT)):
        request = msgspec.convert(
            {"model": "m", "messages": [{"role": "user", "content": text(chars)}]},
            ChatCompletionRequest,
        )
        rows.append((f"chat template + tokenize, {name} prompt", chars,
                     lambda r=request: llm.chat_prompt(r, model)))  # fmt: skip
    for name, (body, header_length) in oip_bodies().items():
        rows.append((f"/v2 parse, {name}", len(body),
                     lambda b=body, h=header_length: oip_codec.parse(b, h)))  # fmt: skip
    return rows


def oip_bodies() -> dict[str, tuple[bytes, str | None]]:
    def request(shape: list[int], **more: Any) -> bytes:
        return msgspec.json.encode(
            {"inputs": [{"name": "x", "shape": shape, "datatype": "FP32", **more}]}
        )

    rows = TENSOR_LIMIT // 64 - 1024
    header = request([rows, 16], parameters={"binary_data_size": rows * 64})
    binary = header + np.ones((rows, 16), np.float32).tobytes()
    n = JSON_LIMIT // 10 // 16 * 16
    big_json = request([n // 16, 16], data=[0.123456] * n)
    return {
        "1 x 16 FP32 JSON": (request([1, 16], data=[0.5] * 16), None),
        f"{len(big_json) >> 20} MiB JSON tensor": (big_json, None),
        f"{len(binary) >> 20} MiB binary tensor": (binary, str(len(header))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows = steps()
    width = max(len(r[0]) for r in rows)
    print(f"{'step'.ljust(width)}  {'bytes':>11}  {'inline ms':>9}  {'threaded':>8}")
    for name, size, fn in rows:
        inline = statistics.median(inline_ms(fn) for _ in range(args.runs))
        threaded = statistics.median(threaded_ms(fn) for _ in range(args.runs))
        print(f"{name.ljust(width)}  {size:>11,}  {inline:>9.2f}  {threaded:>8.2f}")


if __name__ == "__main__":
    main()
