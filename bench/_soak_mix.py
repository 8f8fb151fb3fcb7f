"""The soak's other traffic (``bench/soak.py``): OIP ``/v2`` inference on a small tensor model
with two versions whose canary share the admin API changes every ``CANARY_EVERY_S``, and
optionally one streamed chat on the bundled SmolLM2 every ``CHAT_EVERY_S``."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from onnx import TensorProto, helper, numpy_helper

TENSOR_MODEL = "soak-mlp"
CANARY_SHARES = (2, 50, 98)
"""The canary's share of tenants, in turn: the soak's one tenant lands on either side of its
bucket (``registry.routes``) with 96 % odds, so both versions serve; never 0, which would retire
the canary's workers (the soak measures steady processes)."""
CANARY_EVERY_S, V2_EVERY_S, CHAT_EVERY_S = 30.0, 1.0, 5.0
CHAT = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8,
        "stream": True}  # fmt: skip


def tensor_model(seed: int) -> bytes:
    """``y = x W``: ``x`` FP32 [batch, 16] -> ``y`` FP32 [batch, 4]; ``seed`` picks ``W``."""
    w = np.random.default_rng(seed).standard_normal((16, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "soak",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


V2_BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32",
                                  "data": [0.5] * 16}]}).encode()  # fmt: skip


def chat_model_dir() -> Path:
    """The built SmolLM2 folder, as the tests cache it (built now if missing: ~1 minute)."""
    cache = Path(os.environ.get("KILN_TEST_CACHE") or Path.home() / ".cache" / "kiln-test")
    path = cache / "smollm2"
    if not (path / "kiln.json").exists():
        from kiln_runtimes.importers.smollm2 import build

        print(f"building SmolLM2 into {path} ...", flush=True)
        build(path)
    return path


async def upload_versions(base: str, ops_key: str, timeout_s: float = 180.0) -> None:
    """Upload the tensor model's versions 1 and 2 and wait until each answers."""
    ops = {"authorization": f"Bearer {ops_key}"}
    async with aiohttp.ClientSession(headers=ops) as http:
        for version in ("1", "2"):
            url = f"{base}/admin/v1/models/{TENSOR_MODEL}/versions"
            async with http.post(url, data=tensor_model(int(version)),
                                 params={"version": version}) as r:  # fmt: skip
                if r.status != 201:
                    raise RuntimeError(f"upload {version}: {r.status} {await r.text()}")
        deadline = time.monotonic() + timeout_s
        for version in ("1", "2"):
            url = f"{base}/v2/models/{TENSOR_MODEL}/versions/{version}/infer"
            while True:
                async with http.post(url, data=V2_BODY) as r:
                    if r.status == 200:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{TENSOR_MODEL} {version}: {r.status}")
                await asyncio.sleep(1.0)


class Mix:
    """The calls, each counting its statuses in ``statuses`` and served versions in
    ``versions``; ``http`` carries the tenant's inference key."""

    def __init__(
        self, http: aiohttp.ClientSession, base: str, ops_key: str,
        counts: tuple[Counter[str], Counter[str]], chat_model: str | None,
    ) -> None:  # fmt: skip
        self.http, self.base, (self.statuses, self.versions) = http, base, counts
        self.ops = {"authorization": f"Bearer {ops_key}"}
        self.shares = itertools.cycle(CANARY_SHARES)
        self.chat_model = chat_model

    async def infer(self) -> None:
        url = f"{self.base}/v2/models/{TENSOR_MODEL}/infer"
        headers = {"content-type": "application/json"}
        async with self.http.post(url, data=V2_BODY, headers=headers) as r:
            body: dict[str, Any] = await r.json() if r.status == 200 else {}
            self.statuses[f"v2 infer {r.status}"] += 1
        if body:
            self.versions[str(body.get("model_version"))] += 1

    async def canary(self) -> None:
        route = {"stable_version": "1", "canary_version": "2", "canary_percent": next(self.shares)}
        url = f"{self.base}/admin/v1/models/{TENSOR_MODEL}/route"
        async with self.http.put(url, json=route, headers=self.ops) as r:
            await r.read()
            self.statuses[f"canary route {r.status}"] += 1

    async def chat(self) -> None:
        """One streamed chat, read to its end (``data: [DONE]``)."""
        url = f"{self.base}/v1/chat/completions"
        async with self.http.post(url, json={**CHAT, "model": self.chat_model}) as r:
            text = (await r.read()).decode()
            done = r.status == 200 and "[DONE]" in text
            self.statuses[f"chat stream {r.status if done or r.status != 200 else 'cut'}"] += 1
