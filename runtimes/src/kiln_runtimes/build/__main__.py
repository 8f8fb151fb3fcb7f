"""``python -m kiln_runtimes.build SOURCE OUT_DIR``: one JSON object per stdout line.

Progress lines are ``BuildProgress``; the last line is a ``BuildReport`` (exit 0) or a
``BuildFailure`` (exit 2 for input that cannot be built, 1 for a failure of the build itself).
``--detect`` prints the detected ``Source`` and builds nothing. SIGTERM cancels a build and
removes what it staged. Everything libraries print goes
to stderr, so stdout carries only these lines.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

import msgspec

from kiln_runtimes.build._options import PRECISIONS, TARGETS, BuildError, BuildOptions
from kiln_runtimes.protocol import BuildFailure

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m kiln_runtimes.build", description=__doc__)
    parser.add_argument("source", type=Path, help="HF folder, .gguf, GenAI folder or .onnx")
    parser.add_argument("out_dir", type=Path, nargs="?", help="the built folder (replaced)")
    parser.add_argument("--task", choices=("generate", "embeddings"))
    parser.add_argument("--precision", choices=PRECISIONS)
    parser.add_argument("--target", choices=TARGETS, default="cpu")
    parser.add_argument("--name")
    parser.add_argument("--max-memory-bytes", type=int)
    parser.add_argument("--prune-lm-head", action="store_true")
    parser.add_argument("--accuracy-tokens", type=int, default=32)
    parser.add_argument("--source-label", default="")
    parser.add_argument("--detect", action="store_true", help="print what SOURCE is; no build")
    args = parser.parse_args(argv)
    if args.out_dir is None and not args.detect:
        parser.error("OUT_DIR is required unless --detect")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run one build, reporting on a private copy of stdout."""
    args = parse(argv)
    out = _private_stdout()
    # A cancelled build job is sent SIGTERM: unwind, so the staging folder and the builder
    # process go too (``_genai.run_builder`` kills it when interrupted).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    def emit(value: object) -> None:
        out.write(msgspec.json.encode(value).decode() + "\n")
        out.flush()

    return run(args, emit)


def run(args: argparse.Namespace, emit: Callable[[object], None]) -> int:
    """One build (or ``--detect``) of a parsed command line, each line to ``emit``; its exit
    status. A process may run several: the builder's imports are paid once."""
    try:
        from kiln_runtimes.build import build, detect

        if args.detect:
            emit(detect(args.source, args.task))
            return 0
        options = BuildOptions(
            task=args.task, precision=args.precision, target=args.target, name=args.name,
            max_memory_bytes=args.max_memory_bytes, prune_lm_head=args.prune_lm_head,
            accuracy_tokens=args.accuracy_tokens, source_label=args.source_label,
        )  # fmt: skip
        emit(build(args.source, args.out_dir, options, emit))
    except BuildError as exc:
        emit(exc.failure())
        return 2
    except Exception as exc:  # the caller reads one JSON line
        import traceback

        traceback.print_exc()
        emit(BuildFailure(error=f"{type(exc).__name__}: {exc}"))
        return 1
    return 0


def _private_stdout() -> IO[str]:
    """Keep the real stdout for the JSON lines; point file descriptor 1 at stderr."""
    sys.stdout.flush()
    real = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    return real


if __name__ == "__main__":
    sys.exit(main())
