"""Bring your own model end to end: tiny random-weight folders imported through the admin API
(and the CLI), built by build jobs, then called with the official ``openai`` SDK.

fp32 generation must reproduce transformers' greedy tokens; embeddings must match
sentence-transformers; an int4 build reports its agreement; every bad input is a 400 or a
failed job naming the file and field, with the store's trees and the versions unchanged.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest

from .conftest import free_port
from .pgdata import copy_migrated_pg

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.e2e.conftest import KilnProcess

pytestmark = pytest.mark.slow
MEMORY_LIMIT = 2_000_000
"""``KILN_WORKER_MAX_MEMORY_BYTES`` of this module's Kiln: the tiny models fit (~0.5 MB at
fp32), the "large" Llama (~6 MB) does not."""
GENERATORS = ("llama",)
"""One architecture goes the whole way through the API here; Qwen2, Phi-3 and Gemma builds
reproduce transformers' greedy tokens in tests/integration/runtimes/test_build_generate.py."""
POOLINGS = ("mean", "cls")
TOKENS = 32
TEXTS = ["The quick brown fox jumps over the lazy dog.", "a cat sits on the mat", "Kiln"]
LABELS = ("negative", "neutral", "positive")
PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, tiny_models: Any) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    made = {kind: tiny_models.causal(root / kind, kind, seed=7) for kind in GENERATORS}
    generation = made["llama"] / "generation_config.json"  # the model's own default: greedy
    generation.write_text(json.dumps({**json.loads(generation.read_text()), "top_k": 1}))
    for pooling in POOLINGS:  # the CLS folder's texts get its default prompt, as e5's
        prompts = {"prompts": PROMPTS, "default_prompt_name": "query"} if pooling == "cls" else {}
        made[f"bert-{pooling}"] = tiny_models.sentence(
            root / f"bert-{pooling}", pooling, normalize=pooling == "mean", **prompts
        )
    config = made["bert-mean"] / "config.json"  # trained to be cut to 32 (Matryoshka)
    config.write_text(json.dumps({**json.loads(config.read_text()), "matryoshka_dimensions": [32]}))
    made["think"] = tiny_models.causal(root / "think", "qwen2", seed=7, think=True)
    made["harmony"] = tiny_models.causal(root / "harmony", "qwen2", seed=7, harmony=True)
    made["bert-rerank"] = tiny_models.cross_encoder(root / "bert-rerank", seed=3)
    made["bert-classify"] = tiny_models.cross_encoder(root / "bert-classify", seed=4, labels=LABELS)
    return made


def _tar(folder: Path) -> bytes:
    """The folder as a tar archive of ``<name>/...`` (how a user would pack it)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(folder, arcname=folder.name)
    return buffer.getvalue()


def _auth(kiln: KilnProcess) -> dict[str, str]:
    return {"authorization": f"Bearer {kiln.key}"}


def _import(kiln: KilnProcess, name: str, body: bytes, **params: str) -> httpx.Response:
    return httpx.post(
        f"{kiln.base_url}/admin/v1/models/{name}/versions",
        content=body, params=params, headers=_auth(kiln), timeout=120,
    )  # fmt: skip


def _job(kiln: KilnProcess, job_id: str) -> dict[str, Any]:
    r = httpx.get(f"{kiln.base_url}/admin/v1/compile-jobs/{job_id}", headers=_auth(kiln))
    r.raise_for_status()
    return dict(r.json())


def _wait_job(kiln: KilnProcess, job_id: str, timeout: float = 400) -> dict[str, Any]:
    """Poll the job until it ends; returns it, with the phases seen on the way."""
    deadline, seen = time.monotonic() + timeout, list[tuple[str, int]]()
    while time.monotonic() < deadline:
        job = _job(kiln, job_id)
        if not seen or seen[-1] != (job["phase"], job["percent"]):
            seen.append((job["phase"], job["percent"]))
        if job["status"] in ("done", "failed"):
            job["seen"] = seen
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} still {job['status']} after {timeout} s")


def _state(kiln: KilnProcess) -> tuple[set[str], str]:
    """The store's trees and every model's newest version."""
    trees = Path(kiln.env["KILN_DATA_DIR"]) / "store" / "trees"
    names = {p.name for p in trees.iterdir()} if trees.is_dir() else set()
    return names, kiln.cli("models", "list")


@pytest.fixture(scope="module")
def kiln(sources: dict[str, Path], start_kiln: Callable[..., KilnProcess]) -> Iterator[KilnProcess]:
    """``kiln up`` with no model, a platform-admin key that may also infer, and every tiny
    model imported through the API (the builds queue up behind each other)."""
    path = Path(tempfile.mkdtemp(prefix="kiln-e2e-"))
    copy_migrated_pg(path / "pg")
    env = {"KILN_WORKER_MAX_MEMORY_BYTES": str(MEMORY_LIMIT), "KILN_GRPC_PORT": str(free_port())}
    kiln = start_kiln(path, [], env)
    try:
        kiln.cli("tenants", "create", "acme")
        out = kiln.cli(
            "keys", "create", "--tenant", "acme", "--role", "platform-admin",
            "--scope", "inference", "--scope", "admin:write",
        )  # fmt: skip
        kiln.env["TEST_KEY"] = out.strip().splitlines()[-1]
        jobs = {}
        for name, folder in sources.items():
            scoring = {} if name.startswith("bert") else {"score_prompts": "true"}
            r = _import(kiln, f"tiny-{name}", _tar(folder), precision="fp32", **scoring)
            assert r.status_code == 202, r.text
            assert r.json()["phase"] == "received"
            jobs[name] = r.json()["id"]
        kiln.env["JOBS"] = json.dumps(jobs)
        yield kiln
    finally:
        if kiln.proc.poll() is None:
            kiln.stop()
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def built(kiln: KilnProcess) -> dict[str, dict[str, Any]]:
    """Every import's finished job."""
    return {name: _wait_job(kiln, job) for name, job in json.loads(kiln.env["JOBS"]).items()}


def _openai(kiln: KilnProcess) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0, timeout=120)


def _reference_greedy(folder: Path, messages: list[dict[str, str]]) -> tuple[list[int], str]:
    """transformers' greedy tokens for the chat prompt (as the gateway renders and tokenizes
    it), stopping where the served model stops (``eos_token_id``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    encoded: Any = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True
    )
    if isinstance(encoded, dict) or hasattr(encoded, "input_ids"):
        encoded = encoded["input_ids"]
    prompt: list[int] = list(encoded)
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([list(prompt)]), max_new_tokens=TOKENS, do_sample=False,
            eos_token_id=model.config.eos_token_id, pad_token_id=model.config.eos_token_id,
        )  # fmt: skip
    ids: list[int] = out[0, len(prompt) :].tolist()
    if ids and ids[-1] == model.config.eos_token_id:
        ids = ids[:-1]
    return ids, str(tokenizer.decode(ids, skip_special_tokens=True))


@pytest.mark.parametrize("kind", GENERATORS)
def test_fp32_chat_equals_transformers_greedy(
    kind: str, kiln: KilnProcess, built: dict[str, dict[str, Any]], sources: dict[str, Path]
) -> None:
    job = built[kind]
    assert job["status"] == "done", job
    assert job["version"] == "1"
    assert [p for p, _ in job["seen"]][-1] == "ready"
    accuracy = job["report"]["accuracy"]
    assert accuracy["type"] == "generate"
    assert accuracy["equal_prefix"] == TOKENS
    kiln.wait_until_serving(f"tiny-{kind}", path="completions")
    messages = [{"role": "user", "content": "Once upon a time there was a kiln"}]
    reference_ids, reference_text = _reference_greedy(sources[kind], messages)
    chat = _openai(kiln).chat.completions.create(
        model=f"tiny-{kind}", messages=messages, temperature=0, max_tokens=TOKENS
    )
    print(kind, chat.usage, repr(chat.choices[0].message.content), reference_ids)
    assert len(reference_ids) >= TOKENS, "the tiny model stops early: pick another seed"
    assert chat.usage.completion_tokens == len(reference_ids)
    assert chat.choices[0].message.content == reference_text
    assert chat.choices[0].finish_reason == "length"


def test_a_request_leaving_sampling_out_gets_the_models_defaults(
    kiln: KilnProcess, built: dict[str, dict[str, Any]]
) -> None:
    """vLLM's ``--generation-config auto``: the tiny Llama's ``generation_config.json`` says
    ``top_k: 1``, so a completion that leaves it out is greedy at the default temperature; one
    that sets it samples."""
    assert built["llama"]["status"] == "done", built["llama"]
    version = httpx.get(
        f"{kiln.base_url}/admin/v1/models/tiny-llama/versions/1", headers=_auth(kiln)
    ).json()
    assert version["manifest"]["sampling"] == {"top_k": 1.0}
    kiln.wait_until_serving("tiny-llama", path="completions")
    client = _openai(kiln)

    def text(**fields: Any) -> str:
        made = client.completions.create(model="tiny-llama", prompt="Once upon a time",
                                         max_tokens=12, **fields)  # fmt: skip
        return str(made.choices[0].text)

    greedy = text(temperature=0)
    assert {text() for _ in range(3)} == {greedy}
    sampled = {text(temperature=1.5, seed=seed, extra_body={"top_k": -1}) for seed in range(4)}
    assert len(sampled) > 1


def test_tritons_generate_is_a_text_completion(
    kiln: KilnProcess, built: dict[str, dict[str, Any]]
) -> None:
    """Triton's generate extension on `/v2`: ``text_output`` is the completion's text after
    the input (unless ``exclude_input_in_output``), the sampling fields flat, in
    ``parameters`` or in vLLM's ``sampling_parameters``; streamed, its pieces make the same
    text; a field no completion takes is a 400 naming it, in OIP's error shape."""
    assert built["llama"]["status"] == "done", built["llama"]
    kiln.wait_until_serving("tiny-llama", path="completions")
    prompt = "Once upon a time"
    want = _openai(kiln).completions.create(model="tiny-llama", prompt=prompt, max_tokens=9,
                                            temperature=0).choices[0].text  # fmt: skip
    url = f"{kiln.base_url}/v2/models/tiny-llama"
    bodies: list[dict[str, Any]] = [  # TensorRT-LLM's example, vLLM backend's two ways
        {
            "text_input": prompt,
            "max_tokens": 9,
            "temperature": 0,
            "bad_words": "",
            "stop_words": "",
        },
        {"text_input": prompt, "parameters": {"max_tokens": 9, "temperature": 0}},
        {"text_input": prompt, "sampling_parameters": '{"max_tokens": 9, "temperature": 0}'},
    ]
    for body in bodies:
        r = httpx.post(f"{url}/generate", json=body, headers=_auth(kiln), timeout=60)
        assert r.status_code == 200, r.text
        assert r.json() == {"model_name": "tiny-llama", "model_version": "1",
                            "text_output": prompt + want}  # fmt: skip
    alone = {**bodies[0], "exclude_input_in_output": True}
    r = httpx.post(f"{url}/versions/1/generate", json=alone, headers=_auth(kiln), timeout=60)
    assert r.json()["text_output"] == want
    with httpx.stream("POST", f"{url}/generate_stream", json=alone, headers=_auth(kiln),
                      timeout=60) as events:  # fmt: skip
        assert events.headers["content-type"].startswith("text/event-stream")
        pieces = [json.loads(line[6:]) for line in events.iter_lines() if line.startswith("data: ")]
    assert "".join(p["text_output"] for p in pieces) == want
    refused = (({"max_tokens": 9}, "text_input"), ({**alone, "beam": 2}, "beam"),
               ({**alone, "text_input": ""}, "text_input"), ({**alone, "n": 2}, "'n'"))  # fmt: skip
    for bad, named in refused:
        r = httpx.post(f"{url}/generate", json=bad, headers=_auth(kiln), timeout=60)
        assert r.status_code == 400
        assert named in r.json()["error"]


def _llm_inputs(module: Any, stream: bool | None = None, **sampling: Any) -> list[Any]:
    """Triton's vLLM backend's inputs (``sampling_parameters`` JSON), or with ``sampling``
    as TensorRT-LLM's flat tensors."""
    given: dict[str, tuple[str, Any]] = {"text_input": ("BYTES", "Once upon a time")}
    if stream is not None:
        given["stream"] = ("BOOL", stream)
    if "vllm" in sampling:
        given["sampling_parameters"] = ("BYTES", json.dumps(sampling.pop("vllm")))
    given |= {k: ("INT32" if isinstance(v, int) else "FP32", v) for k, v in sampling.items()}
    made = []
    for name, (datatype, value) in given.items():
        tensor = module.InferInput(name, [1], datatype)
        kind = {"BYTES": object, "BOOL": bool, "INT32": np.int32, "FP32": np.float32}[datatype]
        tensor.set_data_from_numpy(np.array([value], dtype=kind))
        made.append(tensor)
    return made


def test_an_llm_takes_tritons_llm_tensors(
    kiln: KilnProcess, built: dict[str, dict[str, Any]]
) -> None:
    """Triton's LLM backends' tensor face (vLLM's, TensorRT-LLM's): ``text_input`` in and
    ``text_output`` out over REST ``…/infer`` and gRPC ``ModelInfer``, the input first unless
    ``exclude_input_in_output``; gRPC ``ModelStreamInfer`` with ``stream`` sends the pieces
    (then an empty final response when asked), requests on one stream told apart by id, a bad
    one's error a response of its own while the stream goes on."""
    import queue

    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    assert built["llama"]["status"] == "done", built["llama"]
    kiln.wait_until_serving("tiny-llama", path="completions")
    prompt, greedy = "Once upon a time", {"max_tokens": 9, "temperature": 0}
    want = _openai(kiln).completions.create(model="tiny-llama", prompt=prompt,
                                            **greedy).choices[0].text  # fmt: skip
    http = triton_http.InferenceServerClient(kiln.base_url.removeprefix("http://"))
    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{kiln.env['KILN_GRPC_PORT']}")
    described = http.get_model_metadata("tiny-llama", headers=_auth(kiln))
    assert {i["name"] for i in described["inputs"]} >= {"text_input", "stream"}
    (output,) = grpc.get_model_metadata("tiny-llama", headers=_auth(kiln)).outputs
    assert output.name == "text_output"
    config = grpc.get_model_config("tiny-llama", headers=_auth(kiln)).config
    assert (config.max_batch_size, config.model_transaction_policy.decoupled) == (0, True)
    assert http.get_model_config("tiny-llama", headers=_auth(kiln))["input"][0] == {
        "name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}  # fmt: skip
    listed = http.get_model_repository_index(headers=_auth(kiln))
    assert "tiny-llama" in {m["name"] for m in listed}
    before = _llm_stat(http.get_inference_statistics("tiny-llama", headers=_auth(kiln)))
    unknown = triton_http.InferRequestedOutput("logits")
    with pytest.raises(triton_http.InferenceServerException, match=r"outputs\[0\]\.name"):
        http.infer("tiny-llama", _llm_inputs(triton_http, False, vllm=greedy),
                   outputs=[unknown], headers=_auth(kiln))  # fmt: skip
    answered = http.infer("tiny-llama", _llm_inputs(triton_http, False, vllm=greedy),
                          headers=_auth(kiln))  # fmt: skip
    assert answered.as_numpy("text_output").tolist() == [(prompt + want).encode()]
    flat = _llm_inputs(triton_grpc, max_tokens=9, temperature=0.0)
    alone = triton_grpc.InferInput("exclude_input_in_output", [1], "BOOL")
    alone.set_data_from_numpy(np.array([True]))
    answered = grpc.infer("tiny-llama", [*flat, alone], headers=_auth(kiln))
    assert answered.as_numpy("text_output").tolist() == [want.encode()]
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    grpc.start_stream(callback=lambda result, error: got.put((result, error)),
                      headers=_auth(kiln))  # fmt: skip
    streamed = _llm_inputs(triton_grpc, True, vllm=greedy)
    grpc.async_stream_infer("tiny-llama", streamed, request_id="a",
                            enable_empty_final_response=True)  # fmt: skip
    grpc.async_stream_infer("tiny-llama", _llm_inputs(triton_grpc, True, vllm={"beam": 2}),
                            request_id="b")  # fmt: skip
    grpc.async_stream_infer("tiny-llama", [*streamed, alone], request_id="c")
    grpc.stop_stream()
    texts: dict[str, list[tuple[str, bool]]] = {"a": [], "c": []}
    errors = []
    while not got.empty():
        result, error = got.get()
        if error is not None:
            errors.append(str(error))
            continue
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        out = result.as_numpy("text_output")
        texts[response.id].append(("" if out is None else out[0].decode(), final))
    assert "".join(t for t, _ in texts["a"]) == prompt + want
    assert [f for _, f in texts["a"]] == [False] * (len(texts["a"]) - 1) + [True]
    assert texts["a"][-1][0] == ""  # the empty final response
    assert texts["a"][0] == (prompt, False)  # the input first, then the pieces
    assert "".join(t for t, _ in texts["c"]) == want
    assert texts["c"][-1][1]  # final with its last piece
    assert texts["c"][-1][0]
    assert len(errors) == 1
    assert "beam" in errors[0]
    deadline = time.monotonic() + 10  # 4 answered: REST, gRPC, and 2 on the stream
    while (stat := _llm_stat(grpc.get_inference_statistics("tiny-llama", headers=_auth(kiln),
                                                           as_json=True)))["inference_count"] < (
            before["inference_count"] + 4):  # fmt: skip
        assert time.monotonic() < deadline, (before, stat)
        time.sleep(0.1)
    assert int(stat["inference_count"]) == before["inference_count"] + 4
    assert int(stat["execution_count"]) == before["execution_count"] + 4
    grpc.close()


def _llm_stat(stats: Any) -> Any:
    """tiny-llama's statistics entry (gRPC's JSON has its counts as strings)."""
    (stat,) = [s for s in stats["model_stats"] if s["name"] == "tiny-llama"]
    return {**stat, "inference_count": int(stat.get("inference_count", 0)),
            "execution_count": int(stat.get("execution_count", 0))}  # fmt: skip


@pytest.fixture(scope="module")
def scoring(
    kiln: KilnProcess, built: dict[str, dict[str, Any]], sources: dict[str, Path]
) -> tuple[list[int], Any]:
    """A prompt's token ids and transformers' log-softmax at each of its positions, from the
    tiny Llama's source weights (its build keeps every position's logits)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert built["llama"]["status"] == "done"
    kiln.wait_until_serving("tiny-llama", path="completions")
    folder = sources["llama"]
    prompt = AutoTokenizer.from_pretrained(folder)(" ".join(TEXTS))["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return prompt, torch.log_softmax(model(torch.tensor([prompt])).logits[0], -1).numpy()


def test_an_echoed_prompt_is_scored_as_transformers_scores_it(
    kiln: KilnProcess, scoring: tuple[list[int], Any]
) -> None:
    """lm-evaluation-harness's log-likelihood request (``echo``, ``logprobs``, token ids in):
    the prompt tokens' log-probabilities are the source model's, streamed or not."""
    prompt, want = scoring
    expected = [float(want[i, t]) for i, t in enumerate(prompt[1:])]
    client = _openai(kiln)
    args: dict[str, Any] = {"model": "tiny-llama", "prompt": prompt, "echo": True,
                            "logprobs": 2, "max_tokens": 1, "temperature": 0}  # fmt: skip
    got = client.completions.create(**args).choices[0]
    scored = got.logprobs
    assert scored is not None
    assert len(scored.tokens) == len(prompt) + 1  # the prompt's, then the one generated
    assert scored.token_logprobs[0] is None
    assert scored.top_logprobs is not None
    assert scored.top_logprobs[0] is None
    assert "".join(scored.tokens) == got.text
    assert scored.text_offset == [len("".join(scored.tokens[:i])) for i in range(len(prompt) + 1)]
    lm_eval = scored.token_logprobs[1 : len(prompt)]  # what the harness sums: [ctxlen:-1]
    assert max(abs(a - b) for a, b in zip(lm_eval, expected, strict=True)) < 1e-3
    tops: list[Any] = scored.top_logprobs[1 : len(prompt)]
    pairs = zip(tops, scored.tokens[1 : len(prompt)], strict=True)
    is_greedy = [max(top, key=top.get) == token for top, token in pairs]
    assert is_greedy == [int(want[i].argmax()) == t for i, t in enumerate(prompt[1:])]
    streamed = list(client.completions.create(**args, stream=True))
    first = streamed[0].choices[0]
    assert first.text == got.text[: scored.text_offset[len(prompt)]]
    assert first.logprobs is not None
    assert first.logprobs.token_logprobs == scored.token_logprobs[: len(prompt)]


def test_vllms_prompt_logprobs_rank_each_prompt_token(
    kiln: KilnProcess, scoring: tuple[list[int], Any]
) -> None:
    """vLLM's ``prompt_logprobs``: per prompt token (``None`` for the first), by token id, the
    token itself with its rank and the most probable ones; on a chat, its templated prompt."""
    import openai

    prompt, want = scoring
    client = _openai(kiln)
    text = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=1,
                                     extra_body={"prompt_logprobs": 1})  # fmt: skip
    got = (text.choices[0].model_extra or {})["prompt_logprobs"]
    assert len(got) == len(prompt)
    assert got[0] is None
    for row, position, token in zip(want[:-1], got[1:], prompt[1:], strict=True):
        own = position[str(token)]
        assert abs(own["logprob"] - row[token]) < 1e-3
        above = int((row > row[token] + 1e-4).sum()) + 1  # surely more probable: before it
        tied = int((np.abs(row - row[token]) <= 1e-4).sum())  # within the builds' difference
        assert above <= own["rank"] <= above + tied - 1
        assert position[str(int(row.argmax()))]["rank"] == 1
        assert len(position) == (1 if own["rank"] == 1 else 2)
    chat = client.chat.completions.create(model="tiny-llama", max_tokens=1,
                                          messages=[{"role": "user", "content": TEXTS[0]}],
                                          extra_body={"prompt_logprobs": 0})  # fmt: skip
    scores = (chat.model_extra or {})["prompt_logprobs"]
    assert chat.usage is not None
    assert len(scores) == chat.usage.prompt_tokens
    assert all(len(position) == 1 for position in scores[1:])
    with pytest.raises(openai.BadRequestError, match="stream"):
        client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=1, stream=True,
                                  extra_body={"prompt_logprobs": 1})  # fmt: skip


THINKING = {"structured_outputs": {"regex": "<think>[a-z]{3,6}</think>[a-z]{3,6}"}}
"""A reasoning model's answer forced into shape: its thoughts, then its content (random weights
write no tags of their own)."""


def test_a_reasoning_models_thoughts_are_its_reasoning(
    kiln: KilnProcess, built: dict[str, dict[str, Any]]
) -> None:
    """A model whose tokenizer has ``<think>`` and ``</think>`` answers with what it writes
    between them as the message's ``reasoning`` (vLLM's), the rest as ``content``: whole and
    streamed alike, left out with ``include_reasoning: false``; its text completion is raw."""
    assert built["think"]["status"] == "done", built["think"]
    name, client = "tiny-think", _openai(kiln)
    kiln.wait_until_serving(name, path="completions")
    asked: dict[str, Any] = {"model": name, "messages": [{"role": "user", "content": "a cat"}],
                             "max_tokens": 40, "temperature": 0}  # fmt: skip
    message = client.chat.completions.create(**asked, extra_body=THINKING).choices[0].message
    reasoning, content = message.model_extra["reasoning"], message.content
    assert message.model_extra["reasoning_content"] == reasoning  # DeepSeek's name too
    assert re.fullmatch("[a-z]{3,6}", reasoning)
    assert re.fullmatch("[a-z]{3,6}", content or "")
    deltas = [c.choices[0].delta for c in client.chat.completions.create(
        **asked, extra_body=THINKING, stream=True) if c.choices]  # fmt: skip
    for field in ("reasoning", "reasoning_content"):
        assert "".join(d.model_extra.get(field) or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == content
    chunks = list(client.chat.completions.create(
        **asked, extra_body=THINKING, stream=True, n=2, logprobs=True,
        stream_options={"include_usage": True}))  # fmt: skip
    for index in (0, 1):  # each choice split apart, every token's log-probability sent
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == index]
        assert "".join(c.delta.model_extra.get("reasoning") or "" for c in mine) == reasoning
        assert "".join(c.delta.content or "" for c in mine) == content
        scored = [t for c in mine if c.logprobs and c.logprobs.content for t in c.logprobs.content]
        assert chunks[-1].usage is not None
        assert 2 * len(scored) == chunks[-1].usage.completion_tokens
    hidden = (
        client.chat.completions.create(**asked, extra_body={**THINKING, "include_reasoning": False})
        .choices[0]
        .message
    )
    assert hidden.content == content
    assert not {"reasoning", "reasoning_content"} & set(hidden.model_extra or {})
    prompt = client.completions.create(model=name, prompt="a cat", max_tokens=40, temperature=0,
                                       extra_body=THINKING).choices[0].text  # fmt: skip
    assert prompt.startswith("<think>")
    assert "</think>" in prompt


def test_a_reasoning_models_structured_answer_follows_its_reasoning(
    kiln: KilnProcess, built: dict[str, dict[str, Any]], sources: dict[str, Path]
) -> None:
    """A structured output holds a reasoning model's answer after its reasoning (vLLM's): the
    prompt's open ``<think>`` (``reasoning_effort``, with the tiny template) or one the model
    opens is closed first, then the content is the schema's JSON (a bias makes ``</think>``
    come at once: random weights write no tags of their own)."""
    from tokenizers import Tokenizer

    assert built["think"]["status"] == "done", built["think"]
    name, client = "tiny-think", _openai(kiln)
    kiln.wait_until_serving(name, path="completions")
    closed = Tokenizer.from_file(str(sources["think"] / "tokenizer.json")).token_to_id("</think>")
    bounded = {"type": "integer", "minimum": 0, "maximum": 999}  # random weights write on
    schema = {"type": "object", "properties": {"a": bounded}, "required": ["a"],
              "additionalProperties": False}  # fmt: skip
    answer = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    said = [{"role": "user", "content": "a cat"}]
    for effort in ("low", None):  # the prompt opens it; the model may
        extra = {} if effort is None else {"reasoning_effort": effort}
        message = client.chat.completions.create(
            model=name, messages=said, max_tokens=40, temperature=0, response_format=answer,
            logit_bias={closed: 100}, **extra,
        ).choices[0].message  # fmt: skip
        assert set(json.loads(message.content or "null")) == {"a"}, message
        if effort is not None:  # closed at once
            assert (message.model_extra or {}).get("reasoning") in ("", "\n", None), message


def test_a_thinking_budget_closes_the_reasoning(
    kiln: KilnProcess, built: dict[str, dict[str, Any]], sources: dict[str, Path]
) -> None:
    """vLLM's ``thinking_token_budget``: a reasoning model's reasoning is closed once it has
    written so many tokens, though the model would not close it (a bias keeps ``</think>``
    away), the answer going on after it; Anthropic's ``budget_tokens`` is the same budget."""
    import anthropic
    import openai
    from tokenizers import Tokenizer

    assert built["think"]["status"] == "done", built["think"]
    name, client = "tiny-think", _openai(kiln)
    kiln.wait_until_serving(name, path="completions")
    tokenizer = Tokenizer.from_file(str(sources["think"] / "tokenizer.json"))
    closed, eos = tokenizer.token_to_id("</think>"), tokenizer.token_to_id("</s>")
    asked: dict[str, Any] = {"model": name, "messages": [{"role": "user", "content": "a cat"}],
                             "max_tokens": 16, "temperature": 0,
                             "reasoning_effort": "low"}  # fmt: skip  # the prompt opens it
    kept = {closed: -100, eos: -100}  # random weights may end at once
    free = client.chat.completions.create(**asked, logit_bias=kept)
    assert free.usage is not None
    assert free.usage.completion_tokens_details is not None
    assert free.usage.completion_tokens_details.reasoning_tokens == 16  # never closed
    unbounded = free.choices[0].message.model_extra["reasoning"]
    for budget in (0, 5):
        done = client.chat.completions.create(
            **asked, logit_bias=kept, extra_body={"thinking_token_budget": budget}
        )
        assert done.usage is not None
        assert done.usage.completion_tokens_details is not None
        assert done.usage.completion_tokens_details.reasoning_tokens == budget + 1  # and the tag
        reasoning = done.choices[0].message.model_extra.get("reasoning") or ""
        assert unbounded.startswith(reasoning)  # the same greedy tokens, cut at the budget
    with pytest.raises(openai.BadRequestError, match="thinking_token_budget"):
        client.chat.completions.create(**asked, extra_body={"thinking_token_budget": -1})
    chat = client.chat.completions.create(**asked, extra_body={"thinking_token_budget": 3})
    claude = anthropic.Anthropic(base_url=kiln.base_url, api_key=kiln.key, max_retries=0)
    message = claude.messages.create(
        model=name, max_tokens=16, messages=asked["messages"], output_config={"effort": "low"},
        thinking={"type": "enabled", "budget_tokens": 3}, extra_body={"temperature": 0},
    )  # fmt: skip
    thought = [b.thinking for b in message.content if b.type == "thinking"]
    assert thought == [chat.choices[0].message.model_extra.get("reasoning")]


WEATHER = [{"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 6}},
    "required": ["city"]}}}]  # fmt: skip


def test_a_reasoning_models_tool_calls_follow_its_reasoning(
    kiln: KilnProcess, built: dict[str, dict[str, Any]], sources: dict[str, Path]
) -> None:
    """With tools, a reasoning model reasons freely, then calls (vLLM's reasoning parser, then
    its tool parser): the message carries its reasoning and its calls, the stream the same
    (reasoning as it comes, the calls whole). Sampled with seeds (a bias makes ``</think>``
    come soon, not at once)."""
    from tokenizers import Tokenizer

    assert built["think"]["status"] == "done", built["think"]
    name, client = "tiny-think", _openai(kiln)
    kiln.wait_until_serving(name, path="completions")
    closed = Tokenizer.from_file(str(sources["think"] / "tokenizer.json")).token_to_id("</think>")
    said = [{"role": "user", "content": "weather?"}]
    thoughts = []
    for seed in range(3):
        asked: dict[str, Any] = {
            "model": name, "messages": said, "tools": WEATHER, "tool_choice": "required",
            "max_tokens": 80, "temperature": 1, "seed": seed, "logit_bias": {closed: 4},
            "reasoning_effort": "low", "parallel_tool_calls": False,
        }  # fmt: skip
        done = client.chat.completions.create(**asked)
        whole, usage = done.choices[0], done.usage
        assert whole.finish_reason == "tool_calls", whole
        assert 1 <= usage.completion_tokens_details.reasoning_tokens < usage.completion_tokens
        message, thought = whole.message, whole.message.model_extra.get("reasoning") or ""
        assert message.content is None
        assert [c.function.name for c in message.tool_calls] == ["weather"]
        assert set(json.loads(message.tool_calls[0].function.arguments)) == {"city"}
        chunks = [c.choices[0] for c in client.chat.completions.create(**asked, stream=True)]
        streamed = [c.delta.model_extra.get("reasoning") or "" for c in chunks]
        assert "".join(streamed) == thought
        calls = [call.function for c in chunks for call in c.delta.tool_calls or []]
        assert [(f.name, f.arguments) for f in calls] == [
            (f.name, f.arguments) for f in [message.tool_calls[0].function]]  # fmt: skip
        assert chunks[-1].finish_reason == "tool_calls"
        thoughts.append(thought)
    assert any(thoughts), thoughts  # some reasoned before calling


def test_auto_tools_are_called_in_the_format_the_template_teaches(
    kiln: KilnProcess, built: dict[str, dict[str, Any]], sources: dict[str, Path]
) -> None:
    """``auto`` tools on a model whose template teaches Qwen 3.5's XML calls: once the model
    opens a call (a bias on its ``<tool_call>`` token), it writes it in that format, each
    parameter held to its schema, and it comes back as ``tool_calls``, whole and streamed."""
    from tokenizers import Tokenizer

    assert built["think"]["status"] == "done", built["think"]
    name, client = "tiny-think", _openai(kiln)
    kiln.wait_until_serving(name, path="completions")
    opening = Tokenizer.from_file(str(sources["think"] / "tokenizer.json")).token_to_id(
        "<tool_call>"
    )
    tools = [{"type": "function", "function": {"name": "w", "parameters": {  # written a
        "type": "object", "properties": {"u": {"enum": ["C", "F"]}, "t": {  # byte a token
            "type": "boolean"}}, "required": ["u", "t"]}}}]  # fmt: skip
    asked: dict[str, Any] = {
        "model": name, "messages": [{"role": "user", "content": "weather?"}], "tools": tools,
        "logit_bias": {opening: 100}, "parallel_tool_calls": False, "max_tokens": 100,
        "temperature": 0,
    }  # fmt: skip
    done = client.chat.completions.create(**asked, logprobs=True)
    (choice,) = done.choices
    assert choice.finish_reason == "tool_calls", "".join(t.token for t in choice.logprobs.content)
    written = "".join(t.token for t in choice.logprobs.content)
    assert written.startswith("<tool_call>\n<function=w>\n<parameter=u>\n"), written
    (call,) = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert (call.function.name, set(arguments)) == ("w", {"u", "t"})
    assert arguments["u"] in ("C", "F")
    assert isinstance(arguments["t"], bool)
    chunks = [c.choices[0] for c in client.chat.completions.create(**asked, stream=True)]
    calls = [c.function for chunk in chunks for c in chunk.delta.tool_calls or []]
    assert [(f.name, f.arguments) for f in calls] == [("w", call.function.arguments)]
    assert chunks[-1].finish_reason == "tool_calls"


def test_words_before_a_call_are_the_messages_content(
    kiln: KilnProcess, built: dict[str, dict[str, Any]], sources: dict[str, Path]
) -> None:
    """A model may write words, then call (Qwen3-Coder's template allows it): the words are
    the message's content, streamed as they come, and the call its ``tool_calls``. Sampled
    with seeds (a bias makes the model open a call soon, not at once)."""
    from tokenizers import Tokenizer

    assert built["think"]["status"] == "done", built["think"]
    name, client = "tiny-think", _openai(kiln)
    kiln.wait_until_serving(name, path="completions")
    opening = Tokenizer.from_file(str(sources["think"] / "tokenizer.json")).token_to_id(
        "<tool_call>"
    )
    tools = [
        {
            "type": "function",
            "function": {
                "name": "w",
                "parameters": {
                    "type": "object",
                    "properties": {"u": {"enum": ["C", "F"]}},
                    "required": ["u"],
                },
            },
        }
    ]
    asked: dict[str, Any] = {
        "model": name, "messages": [{"role": "user", "content": "weather?"}], "tools": tools,
        "logit_bias": {opening: 5}, "parallel_tool_calls": False, "max_tokens": 90,
        "temperature": 1,
    }  # fmt: skip
    kinds = set()
    for seed in range(12):
        whole = client.chat.completions.create(**asked, seed=seed).choices[0]
        said, calls = whole.message.content, whole.message.tool_calls
        kinds.add((bool(said), bool(calls)))
        if not (said and calls):
            continue
        assert "<tool_call>" not in said
        assert whole.finish_reason == "tool_calls"
        chunks = [c.choices[0] for c in client.chat.completions.create(**asked, seed=seed,
                                                                         stream=True)]  # fmt: skip
        words = [c.delta.content for c in chunks if c.delta.content]
        assert "".join(words) == said
        streamed = [c.function for chunk in chunks for c in chunk.delta.tool_calls or []]
        assert [(f.name, f.arguments) for f in streamed] == [
            (c.function.name, c.function.arguments) for c in calls]  # fmt: skip
        break
    assert (True, True) in kinds, kinds


def test_a_gpt_oss_shaped_answer_is_split_by_its_channels(
    kiln: KilnProcess, built: dict[str, dict[str, Any]], sources: dict[str, Path]
) -> None:
    """A model whose tokenizer has harmony's markers (gpt-oss's): a structured output holds
    its final message, after an analysis message it may write first (a bias ends that one at
    once: random weights would write on), and the markers reach no client: the message's
    content is the schema's JSON, whole and streamed."""
    from tokenizers import Tokenizer

    assert built["harmony"]["status"] == "done", built["harmony"]
    name, client = "tiny-harmony", _openai(kiln)
    kiln.wait_until_serving(name, path="completions")
    end = Tokenizer.from_file(str(sources["harmony"] / "tokenizer.json")).token_to_id("<|end|>")
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
              "maximum": 999}}, "required": ["a"], "additionalProperties": False}  # fmt: skip
    asked: dict[str, Any] = {
        "model": name, "messages": [{"role": "user", "content": "a cat"}], "max_tokens": 60,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        "logit_bias": {end: 100}, "temperature": 1,
    }  # fmt: skip
    for seed in range(3):
        message = client.chat.completions.create(**asked, seed=seed).choices[0].message
        said = [message.content or "", (message.model_extra or {}).get("reasoning") or ""]
        assert set(json.loads(said[0])) == {"a"}, said
        assert not any("<|" in text for text in said), said
        chunks = [c.choices[0].delta for c in client.chat.completions.create(
            **asked, seed=seed, stream=True) if c.choices]  # fmt: skip
        assert "".join(d.content or "" for d in chunks) == said[0]


def test_a_gpt_oss_thinking_budget_ends_its_analysis(
    kiln: KilnProcess, built: dict[str, dict[str, Any]], sources: dict[str, Path]
) -> None:
    """``thinking_token_budget`` on harmony's channels: an analysis message the model would
    not end (a bias keeps ``<|end|>`` away) runs to ``max_tokens`` without it; with it, the
    worker ends it and writes the final message's header, and the answer is the schema's."""
    from tokenizers import Tokenizer

    assert built["harmony"]["status"] == "done", built["harmony"]
    name, client = "tiny-harmony", _openai(kiln)
    kiln.wait_until_serving(name, path="completions")
    tokenizer = Tokenizer.from_file(str(sources["harmony"] / "tokenizer.json"))
    end = tokenizer.token_to_id("<|end|>")
    analysis = tokenizer.encode("analysis", add_special_tokens=False).ids
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
              "maximum": 9}}, "required": ["a"], "additionalProperties": False}  # fmt: skip
    asked: dict[str, Any] = {
        "model": name, "messages": [{"role": "user", "content": "a cat"}], "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        "logit_bias": {end: -100, analysis[0]: 50}, "temperature": 1, "seed": 3,
    }  # fmt: skip
    free = client.chat.completions.create(**asked).choices[0]
    assert (free.finish_reason, free.message.content or "") == ("length", "")
    done = client.chat.completions.create(**asked, extra_body={"thinking_token_budget": 4})
    message = done.choices[0].message
    assert set(json.loads(message.content or "")) == {"a"}, message
    assert done.usage is not None
    assert done.usage.completion_tokens_details is not None
    header = 1 + len(analysis) + 1  # <|channel|>analysis<|message|>
    assert done.usage.completion_tokens_details.reasoning_tokens == header + 4 + 1  # and <|end|>


def test_a_reasoning_models_message_has_thinking_blocks(
    kiln: KilnProcess, built: dict[str, dict[str, Any]]
) -> None:
    """Anthropic's Messages (the ``anthropic`` SDK) on a reasoning model: its reasoning is a
    ``thinking`` block before the text, whole and streamed alike (the chat's reasoning and
    content); ``thinking: disabled`` leaves it out."""
    import anthropic

    assert built["think"]["status"] == "done", built["think"]
    name = "tiny-think"
    kiln.wait_until_serving(name, path="completions")
    claude = anthropic.Anthropic(base_url=kiln.base_url, api_key=kiln.key, max_retries=0)
    asked: dict[str, Any] = {"model": name, "max_tokens": 24, "output_config": {"effort": "high"},
                             "messages": [{"role": "user", "content": "a cat"}],
                             "extra_body": {"temperature": 0}}  # fmt: skip
    chat = _openai(kiln).chat.completions.create(
        model=name, messages=asked["messages"], max_tokens=24, temperature=0,
        reasoning_effort="high",
    ).choices[0].message  # fmt: skip
    message = claude.messages.create(**asked)
    kinds = [b.type for b in message.content]
    assert kinds == ["thinking"] + (["text"] if chat.content else [])
    assert message.content[0].thinking == chat.model_extra["reasoning"]
    with claude.messages.stream(**asked) as stream:
        final = stream.get_final_message()
    assert [b.model_dump(exclude={"parsed_output"}) for b in final.content] == [
        b.model_dump() for b in message.content]  # fmt: skip
    hidden = claude.messages.create(**asked, thinking={"type": "disabled"})
    assert "thinking" not in [b.type for b in hidden.content]


def test_a_reasoning_models_responses_carry_its_reasoning(
    kiln: KilnProcess, built: dict[str, dict[str, Any]]
) -> None:
    """``reasoning_effort`` (chat) and ``reasoning.effort`` (Responses) reach the chat template
    (the tiny one opens ``<think>`` for it); a response gives the reasoning as a ``reasoning``
    item before its message, whole and streamed alike, counts its tokens, and takes it back as
    input. A model that does not reason refuses the effort."""
    import openai

    assert built["think"]["status"] == "done", built["think"]
    name, client = "tiny-think", _openai(kiln)
    kiln.wait_until_serving(name, path="completions")
    said = [{"role": "user", "content": "a cat"}]
    chat = client.chat.completions.create(model=name, messages=said, max_tokens=24, temperature=0,
                                          reasoning_effort="high")  # fmt: skip
    plain = client.chat.completions.create(model=name, messages=said, max_tokens=1)
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens + 2  # "<think>\n"
    message = chat.choices[0].message
    reasoning, content = message.model_extra["reasoning"], message.content
    assert reasoning
    asked: dict[str, Any] = {
        "model": name,
        "input": "a cat",
        "max_output_tokens": 24,
        "temperature": 0,
        "reasoning": {"effort": "high", "summary": "auto"},
    }
    done = client.responses.create(**asked, store=True)
    assert client.responses.retrieve(done.id).output == done.output
    thought, *rest = done.output
    assert (thought.type, thought.summary, thought.content[0].text) == ("reasoning", [], reasoning)
    assert [item.content[0].text for item in rest] == ([content] if content else [])
    assert done.output_text == (content or "")
    assert done.reasoning.effort == "high"
    details = done.usage.output_tokens_details
    assert 0 < details.reasoning_tokens <= done.usage.output_tokens
    assert details.reasoning_tokens == chat.usage.completion_tokens_details.reasoning_tokens
    if not content:  # cut inside its reasoning: all of it was reasoning
        assert details.reasoning_tokens == done.usage.output_tokens
    kinds, deltas = [], {"reasoning": "", "text": ""}
    for event in client.responses.create(**asked, stream=True):
        kinds.append(event.type)
        if event.type == "response.reasoning_text.delta":
            deltas["reasoning"] += event.delta
        elif event.type == "response.output_text.delta":
            deltas["text"] += event.delta
        elif event.type in ("response.completed", "response.incomplete"):
            streamed = event.response
    assert deltas == {"reasoning": reasoning, "text": content or ""}
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_item.done")
    assert [item.model_dump() for item in streamed.output] == [
        item.model_dump() | {"id": streamed_item.id}
        for item, streamed_item in zip(done.output, streamed.output, strict=True)
    ]
    again = client.responses.create(
        model=name,
        max_output_tokens=2,
        input=[
            {"role": "user", "content": "a cat"},
            *done.output,
            {"role": "user", "content": "more"},
        ],
    )
    assert again.status in ("completed", "incomplete")
    after = client.responses.create(model=name, previous_response_id=done.id, input="more",
                                    max_output_tokens=2)  # fmt: skip
    assert after.usage.input_tokens == again.usage.input_tokens  # the reasoning item left out
    with pytest.raises(openai.BadRequestError, match="reasoning_effort") as refused:
        client.chat.completions.create(model="tiny-llama", messages=said, reasoning_effort="low")
    assert refused.value.param == "reasoning_effort"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny-llama", input="a", reasoning={"effort": "low"})
    assert refused.value.param == "reasoning.effort"


@pytest.mark.parametrize("pooling", POOLINGS)
def test_embeddings_match_sentence_transformers(
    pooling: str, kiln: KilnProcess, built: dict[str, dict[str, Any]], sources: dict[str, Path]
) -> None:
    """Vectors equal sentence-transformers'; the Matryoshka one (``matryoshka_dimensions``) also
    cut to 32 with OpenAI's ``dimensions``, the other only whole."""
    import openai
    from sentence_transformers import SentenceTransformer

    name = f"bert-{pooling}"
    assert built[name]["status"] == "done", built[name]
    kiln.wait_until_serving(f"tiny-{name}")
    served = _openai(kiln).embeddings.create(model=f"tiny-{name}", input=TEXTS)
    got = np.array([d.embedding for d in served.data], dtype=np.float64)
    want = SentenceTransformer(str(sources[name]), device="cpu").encode(TEXTS)
    cosines = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    print(pooling, cosines)
    assert cosines.min() >= 0.9999
    version = httpx.get(
        f"{kiln.base_url}/admin/v1/models/tiny-{name}/versions/1", headers=_auth(kiln)
    ).json()
    assert version["accuracy"]["type"] == "embeddings"
    assert version["accuracy"]["min_cosine"] >= 0.9999
    assert version["manifest"]["pooling"] == pooling
    cuts = [32] if pooling == "mean" else None
    assert version["manifest"]["matryoshka_dimensions"] == cuts
    if cuts is None:  # not trained to be cut: its whole width only
        with pytest.raises(openai.BadRequestError) as refused:
            _openai(kiln).embeddings.create(model=f"tiny-{name}", input=TEXTS, dimensions=32)
        assert refused.value.param == "dimensions"
        return
    short = _openai(kiln).embeddings.create(model=f"tiny-{name}", input=TEXTS, dimensions=32)
    kept = np.array([d.embedding for d in short.data], dtype=np.float64)
    assert kept.shape == (len(TEXTS), 32)
    first = want[:, :32] / np.linalg.norm(want[:, :32], axis=1, keepdims=True)
    assert np.abs(kept - first).max() < 1e-4  # its first 32 numbers, normalized again
    assert short.usage.total_tokens == served.usage.total_tokens
    with pytest.raises(openai.BadRequestError) as refused:
        _openai(kiln).embeddings.create(model=f"tiny-{name}", input=TEXTS, dimensions=48)
    assert refused.value.param == "dimensions"


def test_a_prompt_name_embeds_as_sentence_transformers(
    kiln: KilnProcess, built: dict[str, dict[str, Any]], sources: dict[str, Path]
) -> None:
    """Text Embeddings Inference's ``prompt_name`` picks a prompt of the folder's
    ``config_sentence_transformers.json`` (its default otherwise, which the test above
    compares): the vectors are ``encode(prompt_name=...)``'s; an unknown name is a 400 naming
    the field."""
    from openai import BadRequestError
    from sentence_transformers import SentenceTransformer

    assert built["bert-cls"]["status"] == "done", built["bert-cls"]
    client = _openai(kiln)
    served = client.embeddings.create(model="tiny-bert-cls", input=TEXTS,
                                      extra_body={"prompt_name": "passage"})  # fmt: skip
    got = np.array([d.embedding for d in served.data], dtype=np.float64)
    reference = SentenceTransformer(str(sources["bert-cls"]), device="cpu")
    want, plain = (reference.encode(TEXTS, prompt_name=name) for name in ("passage", None))
    cosines = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    print("passage", cosines)
    assert cosines.min() >= 0.9999
    assert not np.allclose(want, plain, atol=1e-3)  # the prompt changes the vectors
    assert served.usage.prompt_tokens == sum(
        len(reference.tokenizer("passage: " + text)["input_ids"]) for text in TEXTS
    )
    with pytest.raises(BadRequestError) as refused:
        client.embeddings.create(model="tiny-bert-cls", input=TEXTS,
                                 extra_body={"prompt_name": "document"})  # fmt: skip
    assert refused.value.body["param"] == "prompt_name"  # type: ignore[index]
    assert "passage, query" in refused.value.message


def test_a_cross_encoder_scores_pairs_as_sentence_transformers(
    kiln: KilnProcess, built: dict[str, dict[str, Any]], sources: dict[str, Path]
) -> None:
    """A one-label ``BertForSequenceClassification`` (a reranker) is detected, built and
    served by ``/v1/rerank`` and ``/v1/score`` with ``CrossEncoder.predict``'s scores (and
    Cohere's ``/v2/rerank``, documents cut to their first tokens); it is
    no embeddings model (a 400 naming ``model``)."""
    import cohere
    from openai import BadRequestError
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer

    name = "tiny-bert-rerank"
    assert built["bert-rerank"]["status"] == "done", built["bert-rerank"]
    kiln.wait_until_serving(name, path="rerank")
    query, docs = TEXTS[1], [TEXTS[0], TEXTS[2], "the dog sleeps by the fire"]
    folder = str(sources["bert-rerank"])
    want = CrossEncoder(folder, device="cpu").predict([[query, d] for d in docs])
    ranked = httpx.post(f"{kiln.base_url}/v1/rerank", headers=_auth(kiln), json={
        "model": name, "query": query, "documents": docs,
    }).json()["results"]  # fmt: skip
    got = {r["index"]: r["relevance_score"] for r in ranked}
    assert [r["relevance_score"] for r in ranked] == sorted(got.values(), reverse=True)
    assert np.allclose([got[j] for j in range(len(docs))], want, atol=1e-5)
    scored = httpx.post(f"{kiln.base_url}/v1/score", headers=_auth(kiln), json={
        "model": name, "text_1": [query, docs[0]], "text_2": [docs[1], docs[2]],
    }).json()["data"]  # fmt: skip
    pairwise = CrossEncoder(folder, device="cpu").predict([[query, docs[1]], [docs[0], docs[2]]])
    assert np.allclose([d["score"] for d in scored], pairwise, atol=1e-5)
    spans = AutoTokenizer.from_pretrained(folder)(docs, add_special_tokens=False,
                                                  return_offsets_mapping=True)  # fmt: skip
    heads = [d[: spans["offset_mapping"][i][:2][-1][1]] for i, d in enumerate(docs)]
    cut = cohere.ClientV2(api_key=kiln.key, base_url=kiln.base_url).rerank(
        model=name, query=query, documents=docs, max_tokens_per_doc=2
    )
    assert np.allclose([r.relevance_score for r in sorted(cut.results, key=lambda r: r.index)],
                       CrossEncoder(folder, device="cpu").predict([[query, h] for h in heads]),
                       atol=1e-5)  # fmt: skip
    with pytest.raises(BadRequestError) as refused:
        _openai(kiln).embeddings.create(model=name, input="a cat")
    assert refused.value.body["param"] == "model"  # type: ignore[index]
    version = httpx.get(
        f"{kiln.base_url}/admin/v1/models/{name}/versions/1", headers=_auth(kiln)
    ).json()
    assert (version["manifest"]["task"], version["manifest"]["scores"]) == ("embeddings", True)
    assert version["accuracy"]["type"] == "score"
    assert version["accuracy"]["max_abs_diff"] < 1e-5


def test_a_classifier_answers_as_transformers_pipeline(
    kiln: KilnProcess, built: dict[str, dict[str, Any]], sources: dict[str, Path]
) -> None:
    """A ``BertForSequenceClassification`` of three labels is detected, built and served by
    vLLM's ``/v1/classify`` (and ``/classify``) with the pipeline's probabilities; it serves
    nothing else, and nothing else is classified (400s naming ``model``)."""
    from transformers import pipeline

    name = "tiny-bert-classify"
    assert built["bert-classify"]["status"] == "done", built["bert-classify"]
    kiln.wait_until_serving(name, path="classify")
    url, headers = f"{kiln.base_url}/v1/classify", _auth(kiln)
    answer = httpx.post(url, headers=headers, json={"model": name, "input": TEXTS}).json()
    classify = pipeline("text-classification", model=str(sources["bert-classify"]), top_k=None)
    answers: Any = classify(TEXTS)
    want = [[next(a["score"] for a in row if a["label"] == label) for label in LABELS]
            for row in answers]  # fmt: skip
    assert [d["index"] for d in answer["data"]] == [0, 1, 2]
    assert np.allclose([d["probs"] for d in answer["data"]], want, atol=1e-5)
    assert [d["label"] for d in answer["data"]] == [LABELS[int(np.argmax(w))] for w in want]
    assert {d["num_classes"] for d in answer["data"]} == {3}
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > len(TEXTS)
    root = httpx.post(f"{kiln.base_url}/classify", headers=headers,
                      json={"model": name, "input": TEXTS[1]}).json()  # fmt: skip
    assert np.allclose(root["data"][0]["probs"], want[1], atol=1e-5)
    wrong = httpx.post(f"{kiln.base_url}/classify", headers=headers, json={"model": name})
    assert (wrong.status_code, wrong.json()["error"]["param"]) == (400, "input")
    refused = [
        httpx.post(url, headers=headers, json={"model": "tiny-bert-rerank", "input": "a"}),
        httpx.post(url, headers=headers, json={"model": "tiny-bert-mean", "input": "a"}),
        httpx.post(f"{kiln.base_url}/v1/embeddings", headers=headers,
                   json={"model": name, "input": "a"}),
        httpx.post(f"{kiln.base_url}/v1/score", headers=headers,
                   json={"model": name, "text_1": "a", "text_2": "b"}),
    ]  # fmt: skip
    assert [(r.status_code, r.json()["error"]["param"]) for r in refused] == [(400, "model")] * 4
    empty = httpx.post(url, headers=headers, json={"model": name, "input": ["a", ""]})
    assert (empty.status_code, empty.json()["error"]["param"]) == (400, "input[1]")
    version = httpx.get(f"{kiln.base_url}/admin/v1/models/{name}/versions/1", headers=headers)
    assert version.json()["manifest"]["labels"] == list(LABELS)
    assert version.json()["accuracy"]["type"] == "classify"
    assert version.json()["accuracy"]["max_abs_diff"] < 1e-5


def test_int4_build_reports_agreement(kiln: KilnProcess, sources: dict[str, Path]) -> None:
    r = _import(kiln, "tiny-llama", _tar(sources["llama"]), precision="int4", version="q4")
    assert r.status_code == 202, r.text
    job = _wait_job(kiln, r.json()["id"])
    assert job["status"] == "done", job
    phases = [p for p, _ in job["seen"]]
    assert "quantizing" in phases
    assert phases[-1] == "ready"
    version = httpx.get(
        f"{kiln.base_url}/admin/v1/models/tiny-llama/versions/q4", headers=_auth(kiln)
    ).json()
    agreement = version["accuracy"]["top1_agreement"]
    print("int4 top-1 agreement", agreement, "equal prefix", version["accuracy"]["equal_prefix"])
    assert 0.0 <= agreement <= 1.0
    assert version["engine_settings"] == {"target": "cpu", "precision": "int4"}
    assert version["manifest"]["precision"] == "int4"
    assert job["report"]["accuracy"] == version["accuracy"]


def test_engine_settings_change_restarts_workers(
    kiln: KilnProcess, built: dict[str, dict[str, Any]]
) -> None:
    assert built["bert-cls"]["status"] == "done"
    kiln.wait_until_serving("tiny-bert-cls")
    before = {p.pid for p in kiln.workers() if "tiny-bert-cls" in " ".join(p.cmdline())}
    url = f"{kiln.base_url}/admin/v1/models/tiny-bert-cls/versions/1"
    r = httpx.patch(url, json={"max_batch_size": 3, "max_context": 16}, headers=_auth(kiln))
    assert r.status_code == 200, r.text
    assert r.json()["engine_settings"]["max_batch_size"] == 3
    assert httpx.patch(url, json={"precision": "int8"}, headers=_auth(kiln)).status_code == 400
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = [p for p in kiln.workers() if "tiny-bert-cls" in " ".join(p.cmdline())]
        if now and {p.pid for p in now}.isdisjoint(before):
            assert "--max-batch-size 3" in " ".join(now[0].cmdline())
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the version's worker did not restart with its new settings")
    kiln.wait_until_serving("tiny-bert-cls")
    long_input = " ".join(["cat"] * 40)  # over max_context 16
    r = httpx.post(
        f"{kiln.base_url}/v1/embeddings", headers=_auth(kiln),
        json={"model": "tiny-bert-cls", "input": long_input},
    )  # fmt: skip
    assert r.status_code == 400, r.text


def test_cli_import_prints_the_version_last(kiln: KilnProcess, sources: dict[str, Path]) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kiln_console", "models", "import", "cli-bert",
         str(sources["bert-mean"]), "--version", "7"],
        env=kiln.env, capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    assert "build job" in run.stderr
    lines = run.stdout.strip().splitlines()
    assert lines[-1] == "7"
    assert lines[-2].startswith("accuracy: min cosine")
    job_line = kiln.cli("models", "jobs").splitlines()[0]
    job_id = job_line.split("\t")[0]
    shown = kiln.cli("models", "jobs", "--id", job_id)
    assert "\tcli-bert\t7\t" in shown
    assert "ready 100%" in shown


# --- bad input: a 400 or a failed job naming file and field; nothing left behind -------------


def _damaged(source: Path, tmp: Path, change: Callable[[Path], None]) -> Path:
    folder = tmp / source.name
    shutil.copytree(source, folder)
    change(folder)
    return folder


def _architecture(name: str) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        config["architectures"] = [name]
        (folder / "config.json").write_text(json.dumps(config))

    return change


def _truncate(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _failed(kiln: KilnProcess, name: str, body: bytes, **params: str) -> dict[str, Any]:
    """Import ``body``; its job must fail, leaving trees and versions as they were."""
    before = _state(kiln)
    r = _import(kiln, name, body, **params)
    assert r.status_code == 202, r.text
    job = _wait_job(kiln, r.json()["id"])
    assert job["status"] == "failed", job
    print(name, job["reason"], job["error_file"], job["error_field"])
    assert _state(kiln) == before
    missing = httpx.get(f"{kiln.base_url}/admin/v1/models/{name}/versions/1", headers=_auth(kiln))
    assert missing.status_code == 404
    return job


def test_unsupported_architecture_fails_the_job(
    kiln: KilnProcess, built: dict[str, Any], sources: dict[str, Path], tmp_path: Path
) -> None:
    folder = _damaged(sources["llama"], tmp_path, _architecture("BloomForCausalLM"))
    job = _failed(kiln, "bad-arch", _tar(folder))
    assert (job["error_file"], job["error_field"]) == ("config.json", "architectures")
    assert "BloomForCausalLM" in job["reason"]


def test_missing_tokenizer_fails_the_job(
    kiln: KilnProcess, built: dict[str, Any], sources: dict[str, Path], tmp_path: Path
) -> None:
    folder = _damaged(sources["llama"], tmp_path, lambda f: (f / "tokenizer.json").unlink())
    job = _failed(kiln, "no-tokenizer", _tar(folder))
    assert job["error_file"] == "tokenizer.json"


def test_corrupt_safetensors_fails_the_job(
    kiln: KilnProcess, built: dict[str, Any], sources: dict[str, Path], tmp_path: Path
) -> None:
    folder = _damaged(sources["llama"], tmp_path, _truncate)
    job = _failed(kiln, "corrupt", _tar(folder))
    assert job["error_file"] == "model.safetensors"
    assert job["error_field"].startswith("model.layers.")


def test_gguf_of_unsupported_type_fails_the_job(
    kiln: KilnProcess, built: dict[str, Any], tiny_models: Any, tmp_path: Path
) -> None:
    gguf = tiny_models.gguf_file(tmp_path / "weird.gguf", "Q8_1")
    job = _failed(kiln, "weird-gguf", gguf.read_bytes())
    assert (job["error_file"], job["error_field"]) == ("model.gguf", "token_embd.weight")
    assert "Q8_1" in job["reason"]


def test_too_large_for_worker_memory_fails_the_job(
    kiln: KilnProcess, built: dict[str, Any], tiny_models: Any, tmp_path: Path
) -> None:
    big = tiny_models.causal(
        tmp_path / "big", "llama", hidden_size=256, intermediate_size=512, num_attention_heads=4
    )
    job = _failed(kiln, "too-big", _tar(big), precision="fp32")
    assert job["error_field"] == "max_memory_bytes"
    assert job["error_file"] == "source"
    assert f"{MEMORY_LIMIT:,}" in job["reason"]


def test_unknown_task_is_a_400_and_stores_nothing(
    kiln: KilnProcess, built: dict[str, Any], sources: dict[str, Path], tmp_path: Path
) -> None:
    folder = _damaged(sources["llama"], tmp_path, _architecture("ViTForImageClassification"))
    before = _state(kiln)
    r = _import(kiln, "vision", _tar(folder))
    assert r.status_code == 400, r.text
    assert "config.json" in r.json()["detail"]
    assert r.json()["param"] == "architectures"
    bad_target = _import(kiln, "vision", _tar(sources["llama"]), target="tensorrt")
    assert bad_target.status_code == 400
    assert bad_target.json()["param"] == "target"
    bert = _import(kiln, "vision", _tar(sources["bert-cls"]), score_prompts="true")
    assert bert.status_code == 400
    assert bert.json()["param"] == "score_prompts"
    assert _state(kiln) == before
