"""Compile a model artifact into a cached engine: ``python -m kiln_runtimes.compile``.

The platform's compile jobs run this as a subprocess (so the control plane never imports an
engine library) and read the ``CompileReport`` JSON on the last line of stdout; workers call
``compile_engine`` in-process on a cache miss. Both record the engine under the same key.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from kiln_runtimes.engines import EngineCache, engine_key, validate_target
from kiln_runtimes.protocol import MANIFEST_NAME, CompileReport, ModelManifest
from kiln_runtimes.store import ArtifactStore, tree_hex

if TYPE_CHECKING:
    from collections.abc import Sequence


def compile_engine(
    store: ArtifactStore,
    artifact_digest: str,
    *,
    target: str,
    precision: str,
    threads: int,
    max_batch: int = 32,
) -> tuple[Path, CompileReport]:
    """The engine folder for (artifact, target, precision) on this machine, built if not cached."""
    tree_hex(artifact_digest)  # a digest, not a path, before anything reads or writes
    checked_target, checked_precision = validate_target(target, precision)
    key = engine_key(artifact_digest, checked_target, checked_precision)
    cache = EngineCache(store)
    cached = cache.lookup(key)
    if cached is not None:
        folder, report = cached
        return folder, msgspec.structs.replace(report, cache_hit=True)
    model_dir = store.path(artifact_digest)
    manifest = msgspec.json.decode((model_dir / MANIFEST_NAME).read_bytes(), type=ModelManifest)
    start = time.perf_counter()
    store.root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kiln-engine-", dir=store.root) as tmp:
        out = Path(tmp) / "engine"
        source = model_dir / manifest.model_file
        if target == "cpu":
            from kiln_runtimes import _compile_cpu

            details = _compile_cpu.build(source, out, manifest, precision, threads)
        else:
            from kiln_runtimes import _compile_gpu

            details = _compile_gpu.build(
                source, out, manifest, target=target, precision=precision, max_batch=max_batch
            )
        (out / MANIFEST_NAME).write_bytes(msgspec.json.encode(manifest))
        engine_digest = store.put_dir(out)
    report = msgspec.convert(
        {
            **details,
            "cache_key": key.digest,
            "engine_digest": engine_digest,
            "target": target,
            "precision": precision,
            "hardware": key.hardware,
            "seconds": time.perf_counter() - start,
        },
        CompileReport,
    )
    cache.record(key, report)
    return store.path(engine_digest), report


def main(argv: Sequence[str] | None = None) -> None:
    """Compile one artifact; the last stdout line is the ``CompileReport`` as JSON."""
    parser = argparse.ArgumentParser(prog="python -m kiln_runtimes.compile", description=__doc__)
    parser.add_argument("--store-dir", type=Path, required=True)
    parser.add_argument("--artifact-digest", required=True)
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    try:
        _, report = compile_engine(
            ArtifactStore(args.store_dir),
            args.artifact_digest,
            target=args.target,
            precision=args.precision,
            threads=args.threads,
            max_batch=args.max_batch_size,
        )
    except Exception as exc:  # the reason goes to the job row; keep it to one line
        print(f"compile failed: {type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
        raise SystemExit(1) from None
    print(msgspec.json.encode(report).decode())


if __name__ == "__main__":
    main()
