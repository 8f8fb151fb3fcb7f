"""The worker's settings: read once from its command line (``worker.parse_args``), passed down."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kiln_runtimes.backends.base import DECODING_PREFILL, EngineOptions
from kiln_runtimes.batch_queue import BatchPolicy


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Everything the worker reads from its command line, read once in ``main``."""

    model_dir: Path
    model: str | None
    version: str
    host: str
    port: int
    max_batch_size: int
    max_wait: float
    threads: int | None
    """Engine intra-op threads (``None``: see :meth:`engine_threads`)."""
    max_queue: int
    log_level: str
    target: str = "cpu"
    precision: str = "fp32"
    concurrency: int = 1
    """Batches run at once (embeddings, tensors), each on ``threads`` engine threads."""
    preempt: bool = True
    """Express requests stop a running normal batch (``batch_queue``)."""
    prefetch: bool = False
    """A full batch may close while every runner is busy (``BatchPolicy.prefetch``)."""
    adaptive: bool = True
    express_lane: bool = True
    """Express batches run on a runner of their own (``BatchPolicy.express_lane``)."""
    """A partial batch waits only for company that is expected (``BatchPolicy.adaptive``)."""
    cpus: frozenset[int] | None = None
    """Cores for the engine's threads; the event loop keeps off them (``kiln_runtimes.cpus``)."""
    adapter_slots: int = 0
    """LoRA adapters a generation worker holds at once (0: none)."""
    adapter_rank: int = 16
    """Columns of one adapter slot (q, k and v of an adapter share them)."""
    prefix_cache_mb: int = 256
    """MiB of KV blocks of prompt prefixes a generation worker keeps for reuse (0: none)."""
    decoding_prefill: int = DECODING_PREFILL
    """Prompt tokens a generation worker prefills per step while sequences decode."""
    idle: bool = False
    """Run at idle CPU priority (``cpus.run_idle``): a background worker's (batch lines, shadow
    copies)."""
    slots: int = 0
    """Requests admitted at once; one more is refused ``busy`` (retryable). 0: no limit (one
    gateway, whose scheduler keeps within the worker's credits)."""
    exit_with_parent: bool = False
    """Drain and exit when the process that started it dies (a gateway's local worker)."""
    metrics_port: int = 0
    """A second port serving ``GET /metrics`` alone, without the secret (0: none)."""
    secret: str = field(default="", repr=False)
    """What every call but the probes must carry (``$KILN_WORKER_SECRET``, not a flag);
    empty: every such call is refused."""

    def engine_threads(self, default: int) -> int:
        """``threads`` if given, else one per ``cpus`` core, else ``default``."""
        return self.threads or (len(self.cpus) if self.cpus else default)

    def engine_options(self, optimized: bool = False) -> EngineOptions:
        """What the engine backend reads (``optimized``: the model is a compiled engine)."""
        return EngineOptions(
            threads=self.engine_threads(0),
            cpus=self.cpus,
            max_batch_size=self.max_batch_size,
            optimized=optimized,
            adapter_slots=self.adapter_slots,
            adapter_rank=self.adapter_rank,
            prefix_cache_bytes=self.prefix_cache_mb << 20,
            decoding_prefill=self.decoding_prefill,
        )

    def batch_policy(self, batching: bool = True) -> BatchPolicy:
        """The batcher's knobs; ``batching=False`` keeps one item per batch."""
        size = self.max_batch_size if batching else 1
        return BatchPolicy(
            size,
            self.max_wait,
            self.max_queue,
            self.concurrency,
            self.preempt,
            self.prefetch,
            self.adaptive,
            self.express_lane,
        )
