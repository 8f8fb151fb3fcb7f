"""Closed-loop streaming load for ``bench/llm.py``: prompts, the SSE client and the statistics.

Every system produces the same record per request (``Req``): when it was sent, and when each
piece of output arrived with how many tokens it carried. Throughput counts the tokens that
arrived inside the measurement window; time to first token is counted for requests sent inside
it; inter-token latency is the gap between consecutive content chunks inside it (what a reader of
the stream sees: a chunk that carries k tokens after a gap of g counts as one gap g).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# A fixed set of varied prompts: short questions, instructions, and a few with some context, so
# prompt lengths spread from ~30 to ~150 tokens once the chat template is applied.
PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain photosynthesis to a ten-year-old.",
    "List three primary colors and one thing that is each color.",
    "Who wrote Hamlet, and what is it about?",
    "What is 17 times 23? Show your steps.",
    "Describe a cat to someone who has never seen one.",
    "Tell me a joke about computers.",
    "Give me three tips for sleeping better.",
    "What is the difference between weather and climate?",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Write a haiku about autumn leaves.",
    "Why is the sky blue?",
    "Summarize the plot of Cinderella in a few sentences.",
    "What are the planets of the solar system, in order from the Sun?",
    "How do I boil an egg so that the yolk stays soft?",
    "Write a Python function that returns the factorial of a number.",
    "What causes the seasons on Earth?",
    "Suggest a name for a small bakery that sells bread and cakes, and explain why.",
    "What is a prime number? Give five examples.",
    "I have a meeting tomorrow at 9 and a dentist appointment at 11, and I need to finish a "
    "report by noon. The report needs about two hours of work. Help me plan my morning.",
    "Here is a short text: 'The river rose quickly after three days of rain. Farmers moved "
    "their animals to higher ground, and the town opened the school gym as a shelter.' "
    "What happened, and why did the town open the gym?",
    "My friend says that heavy objects fall faster than light ones. Is that true? Explain "
    "what happens when you drop a hammer and a feather on Earth and on the Moon.",
    "Write an email to a colleague asking to move our Friday call to Monday afternoon, "
    "politely, in three or four sentences.",
)


def messages(i: int) -> list[dict[str, str]]:
    """The ``i``-th request's chat messages (explicit system message: every template agrees).

    Every request of a run is unique (its number ends the user message), as real traffic is:
    a server's prompt cache can reuse the shared system prompt, never a whole earlier prompt.
    """
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{PROMPTS[i % len(PROMPTS)]} (request {i})"},
    ]


def render(i: int) -> str:
    """The ``i``-th request's prompt as SmolLM2's chat template renders it (for in-process use)."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages(i))
    return text + "<|im_start|>assistant\n"


@dataclass
class Req:
    """One request: send time, content chunks ``(time, text)`` and tokens per chunk (all s)."""

    sent: float
    chunks: list[tuple[float, str]] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # as the server reports it (usage), if it does
    error: str | None = None
    done: bool = False


@dataclass
class Window:
    """The measurement window [start, end] in ``time.perf_counter()`` seconds."""

    start: float
    end: float


class SSEClient:
    """Streams ``/v1/chat/completions`` and records chunk arrival times; cheap on purpose."""

    def __init__(
        self, base_url: str, model: str, key: str | None, *, max_tokens: int, usage: bool
    ) -> None:
        self.url = f"{base_url}/v1/chat/completions"
        self.model = model
        self.headers = {"content-type": "application/json"}
        if key:
            self.headers["authorization"] = f"Bearer {key}"
        self.max_tokens = max_tokens
        self.usage = usage

    def body(self, i: int) -> bytes:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages(i),
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "stream": True,
        }
        if self.usage:
            payload["stream_options"] = {"include_usage": True}
        return json.dumps(payload).encode()

    async def one(self, http: aiohttp.ClientSession, i: int, req: Req) -> None:
        """Send request ``i`` and fill ``req`` as its stream arrives."""
        now = time.perf_counter
        try:
            async with http.post(self.url, data=self.body(i), headers=self.headers) as resp:
                if resp.status != 200:
                    req.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                    return
                async for line in resp.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        req.error = str(event["error"])[:200]
                        return
                    for choice in event.get("choices") or ():
                        text = (choice.get("delta") or {}).get("content")
                        if text:
                            req.chunks.append((now(), text))
                    usage = event.get("usage")
                    if usage:
                        req.prompt_tokens = usage.get("prompt_tokens")
                        req.completion_tokens = usage.get("completion_tokens")
                req.done = True
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
            req.error = f"{type(exc).__name__}: {exc}"[:200]


async def closed_loop(
    client: SSEClient,
    streams: int,
    warmup: float,
    duration: float,
    drain: float,
    *,
    first: int = 0,
) -> tuple[Window, list[Req]]:
    """``streams`` clients, each sending its next request as soon as the previous one ends.

    Client ``k`` sends requests ``first + k``, ``first + k + streams``, ... New requests stop at
    the end of the window; requests in flight then run to completion (at
    most ``drain`` seconds, then they are cancelled), so queued requests still get a TTFT.
    """
    start = time.perf_counter()
    window = Window(start + warmup, start + warmup + duration)
    reqs: list[Req] = []
    # A new loopback connection per request: llama-server closes a connection after a streamed
    # response, and reusing it fails ("Can not write request body"); same for every system.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def worker(k: int) -> None:
            i = first + k
            while time.perf_counter() < window.end:
                req = Req(sent=time.perf_counter())
                reqs.append(req)
                await client.one(http, i, req)
                if req.error:
                    await asyncio.sleep(0.05)  # an erroring server must not spin the loop
                i += streams

        tasks = [asyncio.create_task(worker(k)) for k in range(streams)]
        await asyncio.sleep(max(0.0, window.end - time.perf_counter()))
        _, pending = await asyncio.wait(tasks, timeout=drain)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return window, reqs


def count_tokens(reqs: list[Req], encode_batch: Any) -> None:
    """Tokens per chunk: the chunk texts re-tokenized, scaled to the whole output's token count.

    One tokenizer (SmolLM2's) for every system, so a chunk that merges several tokens (Kiln
    merges what is already generated when the client is behind) is counted fairly; stop tokens
    (EOS) are never counted.
    """
    todo = [r for r in reqs if r.chunks and not r.tokens]
    if not todo:
        return
    whole = encode_batch(["".join(t for _, t in r.chunks) for r in todo])
    pieces = encode_batch([t for r in todo for _, t in r.chunks])
    k = 0
    for r, total in zip(todo, whole, strict=True):
        n = len(r.chunks)
        raw = [max(1, len(p)) for p in pieces[k : k + n]]
        k += n
        scale = len(total) / sum(raw)
        r.tokens = [c * scale for c in raw]


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 100]); NaN for no data."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


@dataclass(frozen=True)
class Stats:
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    requests: int
    completed: int
    errors: int
    mean_output_tokens: float
    mean_prompt_tokens: float
    tokens_per_chunk: float
    first_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def summarize(window: Window, reqs: list[Req]) -> Stats:
    """Window throughput, TTFT of requests sent in the window, ITL of gaps inside it."""
    span = window.end - window.start
    in_window = 0.0
    ttft, itl = [], []
    chunks = tokens = 0.0
    outputs, prompts = [], []
    for r in reqs:
        for (t, _), n in zip(r.chunks, r.tokens, strict=False):
            if window.start <= t <= window.end:
                in_window += n
        if not window.start <= r.sent <= window.end:
            continue
        if r.chunks:
            ttft.append(r.chunks[0][0] - r.sent)
        times = [t for t, _ in r.chunks]
        gaps = itertools.pairwise(times)
        itl += [b - a for a, b in gaps if window.start <= a and b <= window.end]
        if r.done:
            outputs.append(sum(r.tokens))
            chunks += len(r.chunks)
            tokens += sum(r.tokens)
            if r.prompt_tokens is not None:
                prompts.append(r.prompt_tokens)
    sent = [r for r in reqs if window.start <= r.sent <= window.end]
    errors = [r for r in reqs if r.error]
    return Stats(
        tokens_per_s=in_window / span,
        ttft_p50_ms=pct(ttft, 50) * 1e3,
        ttft_p99_ms=pct(ttft, 99) * 1e3,
        itl_p50_ms=pct(itl, 50) * 1e3,
        itl_p99_ms=pct(itl, 99) * 1e3,
        requests=len(sent),
        completed=sum(r.done for r in sent),
        errors=len(errors),
        mean_output_tokens=statistics.fmean(outputs) if outputs else float("nan"),
        mean_prompt_tokens=statistics.fmean(prompts) if prompts else float("nan"),
        tokens_per_chunk=tokens / chunks if chunks else float("nan"),
        first_error=errors[0].error if errors else None,
    )


def measure_round(
    kiln: Any, client: Any, streams: int, duration: float, encode: Any, *, first: int = 0
) -> float:
    """Output tokens/s of one closed-loop round of ``client`` against a quiesced ``kiln``."""
    from _llm_servers import quiesce

    quiesce(kiln.owned())
    window, reqs = asyncio.run(closed_loop(client, streams, 3.0, duration, 60.0, first=first))
    count_tokens(reqs, encode)
    stats = summarize(window, reqs)
    if stats.errors:
        raise RuntimeError(f"{stats.errors} requests failed: {stats.first_error}")
    return stats.tokens_per_s
