"""The workers' and the scheduler's settings (``KILN_WORKER_*``, ``KILN_SCHEDULER_*``): the part
of ``Settings`` that shapes how a pool's workers run; ``Settings`` inherits every field."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kiln_runtimes import cpus
from kiln_runtimes.backends.base import DECODING_PREFILL, MIN_DECODING_PREFILL, PREFILL_CHUNK


class WorkerSettings(BaseSettings):
    """How workers run; every field maps to ``KILN_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="KILN_", frozen=True)

    worker_max_batch_size: int = 32
    worker_max_wait_ms: float = 5.0
    worker_adaptive_wait: bool = True
    """A worker's partial batch waits for company only when its arrival rate says some comes in
    time and pays (``kiln_runtimes._arrivals``); off: it always waits ``worker_max_wait_ms``."""
    worker_max_queue: int = 2048
    """Items a batching worker queues (embedding inputs, tensor rows): also the most one request
    may carry, and what the scheduler keeps in flight per worker at most (docs/scheduler.md)."""
    worker_threads: int | None = None
    worker_concurrency: int = 1
    """Batches a worker runs at once, each on its own ``worker_threads`` engine threads."""
    worker_cpus: str | None = None
    """Cores for workers' engine threads (``1``, ``2-7``); their event loops keep off them, like
    Triton's ``--host-policy cpu-cores`` (docs/architecture.md). Checked by the worker's parser."""
    worker_prefetch: bool = False
    """Workers close a full batch while every runner is busy, one per runner: throughput on
    dedicated cores (its effect on the express lane is not measured apart from noise)."""
    worker_preempt: bool = True
    """An express request stops a worker's running batch and runs first (docs/scheduler.md)."""
    worker_express_runner: bool = True
    """Express batches start at once on a runner beyond ``worker_concurrency`` (not with
    ``worker_prefetch``), and no normal batch starts while one runs (docs/scheduler.md)."""
    worker_slots: int | None = None
    """Requests the scheduler keeps in flight per worker (default: its max batch size)."""
    scheduler_express: bool = True
    """The express lane: each worker takes one request beyond its slots from a tenant with
    nothing in flight in the pool, run at the head of the worker's queue (docs/scheduler.md)."""
    worker_target: str = "cpu"
    """Engine target of tensor workers: cpu, cuda or tensorrt (a GPU machine)."""
    worker_precision: str = "fp32"
    """Engine precision of tensor workers: fp32, int8 (cpu) or fp16 (GPU targets)."""
    worker_adapter_slots: int = 0
    """LoRA adapters a generation worker holds at once (0: the model's graph as built, no
    adapters). Slots cost every step, adapter or not: measured in docs/benchmarks.md."""
    worker_adapter_rank: int = 16
    """Columns of one adapter slot: an adapter's rank times its q/k/v modules must fit."""
    worker_prefix_cache_mb: int = Field(default=256, ge=0)
    """MiB a generation worker keeps for KV blocks of a tenant's prompt prefixes (0: no cache)."""
    worker_decoding_prefill: int = Field(
        default=DECODING_PREFILL, ge=MIN_DECODING_PREFILL, le=PREFILL_CHUNK
    )
    """Prompt tokens a generation worker prefills per step while other sequences decode: every
    running stream's next token waits for that step (docs/llm-engine.md)."""
    worker_start_timeout_s: float = 120.0
    worker_max_memory_bytes: int | None = Field(default=None, gt=0)
    """Memory a worker has for a model's weights: an import whose built weights (parameters x
    bytes per parameter of its precision) exceed it fails, naming the file (None: no limit)."""

    @field_validator("worker_cpus")
    @classmethod
    def _cores(cls, value: str | None) -> str | None:
        if value is not None:
            cpus.parse(value)  # its ValueError names the bad part
        return value
