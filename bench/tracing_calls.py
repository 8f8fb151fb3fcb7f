"""What one request's tracing calls cost, in microseconds of CPU (see docs/benchmarks.md).

Gateway: the server-span middleware around a request that makes the gateway's stage spans
(auth, admission, tokenize, admission.hold, ledger commit, dispatch) and records its fair-queue
wait, and takes the ``traceparent`` a dispatch sends; worker: a task of its own (as each worker
request is) continuing that ``traceparent`` and recording worker queue and batch compute. On:
spans go through a synchronous in-memory exporter, sampled at ``--sample``
(``parentbased_traceidratio``); off: tracing shut down, the same loop. Best of ``--repeats``.
Another tree's code: put its ``platform/src`` and ``runtimes/src`` first on ``PYTHONPATH``.

    python bench/tracing_calls.py --sample 0.01
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any


async def _app(scope: Any, receive: Any, send: Any) -> None:
    from kiln_runtimes import tracing

    for name in ("auth", "admission", "tokenize", "admission.hold", "ledger commit"):
        with tracing.span(name):
            pass
    tracing.record_waited("fair queue", 0.001)
    with tracing.span("dispatch", {"kiln.pool": "bench"}):
        scope["traceparent"] = tracing.traceparent()
    await send({"type": "http.response.start", "status": 200, "headers": []})


async def _worker(traceparent: str | None) -> None:
    from kiln_runtimes import tracing

    with tracing.continued("worker /embed", traceparent):
        tracing.record("worker queue", 1, 2)
        tracing.record("batch compute", 2, 3)


async def _send(message: Any) -> None:
    pass


async def _requests(n: int) -> tuple[float, float]:
    from kiln_platform.observability import tracing_middleware

    middleware, gateway, worker = tracing_middleware(_app), 0.0, 0.0
    for _ in range(n):
        scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": [],
                 "state": {}}  # fmt: skip
        start = time.process_time()
        await middleware(scope, None, _send)  # type: ignore[arg-type]
        middle = time.process_time()
        await asyncio.create_task(_worker(scope["traceparent"]))
        gateway, worker = gateway + middle - start, worker + time.process_time() - middle
    return gateway / n * 1e6, worker / n * 1e6


def main() -> None:
    """Print microseconds per request, gateway and worker, tracing on and off."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sample", default="0.01", help="the sampling ratio when on")
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    os.environ.update(OTEL_TRACES_SAMPLER="parentbased_traceidratio",
                      OTEL_TRACES_SAMPLER_ARG=args.sample)  # fmt: skip
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from kiln_runtimes import tracing

    for state in ("on", "off"):
        if state == "on":
            tracing.configure({}, "bench", exporter=InMemorySpanExporter())
        asyncio.run(_requests(args.requests // 10))  # warm-up
        best = min((asyncio.run(_requests(args.requests)) for _ in range(args.repeats)), key=sum)
        print(f"tracing {state} (sample {args.sample}): gateway {best[0]:.1f} us, "
              f"worker {best[1]:.1f} us per request", flush=True)  # fmt: skip
        tracing.shutdown()


if __name__ == "__main__":
    main()
