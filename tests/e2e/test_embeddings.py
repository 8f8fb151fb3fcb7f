"""`POST /v1/embeddings` through the official openai SDK against a real ``kiln up``."""

from __future__ import annotations

import base64
import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import openai
import psutil
import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "minilm_reference.json"
MODEL = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def client(kiln_up: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{kiln_up.base_url}/v1", api_key=kiln_up.key, max_retries=0)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_matches_sentence_transformers_reference(
    client: openai.OpenAI, encoding_format: str
) -> None:
    ref = json.loads(FIXTURE.read_text())
    resp = client.embeddings.create(
        model=MODEL,
        input=ref["sentences"],
        encoding_format=encoding_format,  # type: ignore[arg-type]
    )
    assert resp.model == MODEL
    assert [d.index for d in resp.data] == list(range(len(ref["sentences"])))
    for got, want in zip(resp.data, ref["embeddings"], strict=True):
        raw: object = got.embedding  # typed list[float]; a str when base64 was asked for
        # the SDK decodes base64 only when it chose the format itself; here the test chose it
        vec = (
            np.frombuffer(base64.b64decode(raw), "<f4") if isinstance(raw, str) else np.asarray(raw)
        )
        assert vec.shape == (384,)
        assert _cos(vec, np.asarray(want)) >= 0.9999
    assert resp.usage.prompt_tokens > len(ref["sentences"])


def test_semantics_cat_kitten_vs_stocks(client: openai.OpenAI) -> None:
    texts = ["a cat sits on the mat", "a kitten rests on the rug", "stock prices fell sharply"]
    cat, kitten, stocks = (
        np.asarray(d.embedding) for d in client.embeddings.create(model=MODEL, input=texts).data
    )
    assert _cos(cat, kitten) > _cos(cat, stocks)


def test_token_id_inputs_equal_text_inputs(client: openai.OpenAI, kiln_up: Any) -> None:
    text = client.embeddings.create(model=MODEL, input="hello world").data[0].embedding
    ids = client.embeddings.create(model=MODEL, input=[[101, 7592, 2088, 102]]).data[0].embedding
    assert _cos(np.asarray(text), np.asarray(ids)) > 0.99999


def test_truncate_prompt_tokens_keeps_an_inputs_last_tokens(client: openai.OpenAI) -> None:
    """vLLM's ``truncate_prompt_tokens``: a document over the context (a 400 without it) keeps
    its last tokens between its special ones, as vLLM's left truncation; -1 is the context."""
    tail = "the cat sits on the mat"  # six tokens, eight with [CLS] and [SEP]
    long = "filler " * 600 + tail
    cut = client.embeddings.create(model=MODEL, input=[long, tail],
                                   extra_body={"truncate_prompt_tokens": 8})  # fmt: skip
    alone = client.embeddings.create(model=MODEL, input=tail)
    assert cut.usage.prompt_tokens == 2 * alone.usage.prompt_tokens == 16
    for got in cut.data:
        assert _cos(np.asarray(got.embedding), np.asarray(alone.data[0].embedding)) > 0.99999
    context = client.models.retrieve(MODEL).model_extra["max_model_len"]  # type: ignore[index]
    whole = client.embeddings.create(model=MODEL, input=long,
                                     extra_body={"truncate_prompt_tokens": -1})  # fmt: skip
    assert whole.usage.prompt_tokens == context
    ids = client.embeddings.create(model=MODEL, input=[[101, 7592, 2088, 102]],
                                   extra_body={"truncate_prompt_tokens": 3})  # fmt: skip
    assert ids.usage.prompt_tokens == 3  # token ids: their last three


def test_server_timing_says_where_the_time_went(client: openai.OpenAI) -> None:
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=["a", "b", "c"])
    parts = dict(p.strip().split(";dur=") for p in raw.headers["server-timing"].split(","))
    timings = {name: float(ms) for name, ms in parts.items()}
    assert {"queue", "worker-queue", "compute", "total"} <= timings.keys()
    assert timings["compute"] > 0
    assert timings["total"] >= timings["queue"] + timings["worker-queue"] + timings["compute"]
    assert "express" in timings  # a light tenant on a quiet pool takes the express lane
    assert raw.parse().data[2].index == 2


def test_models_endpoints(client: openai.OpenAI) -> None:
    assert MODEL in [m.id for m in client.models.list()]
    card = client.models.retrieve(MODEL)
    # vLLM's: sentence-transformers' max_seq_length, 256 of the model's 512 positions
    assert (card.id, (card.model_extra or {}).get("max_model_len")) == (MODEL, 256)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_missing_or_wrong_key_is_401(kiln_up: Any) -> None:
    for key in ("kiln_00000000_wrong", "sk-not-a-kiln-key"):
        bad = openai.OpenAI(base_url=f"{kiln_up.base_url}/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.embeddings.create(model=MODEL, input="x")
    r = httpx.post(f"{kiln_up.base_url}/v1/embeddings", json={"model": MODEL, "input": "x"})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert r.headers["x-request-id"]
    paths = ("/v1/embeddings", "/v1/chat/completions", "/v1/responses", "/v1/batches",
             "/tokenize", "/v2/models/any/infer")  # fmt: skip
    for path in paths:  # the key before the body: a malformed one does not come first
        for headers in ({}, {"authorization": "Bearer kiln_00000000_wrong"}):
            r = httpx.post(f"{kiln_up.base_url}{path}", json={"bad": 1}, headers=headers)
            assert r.status_code == 401, (path, r.text)


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.embeddings.create(model="no-such-model", input="x")
    assert err.value.body["code"] == "model_not_found"  # type: ignore[index]


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"input": ""}, "input[0]"),
        ({"input": []}, "input"),
        ({"input": ["ok"] * 10_000}, "input"),
        ({"input": ["ok"] * 2049}, "input"),
        ({"input": ["ok", 3]}, "input"),
        ({"input": [["a"]]}, "input[0]"),
        ({"input": 42}, "input"),
        ({"input": "word " * 600}, "input[0]"),
        ({"input": [[1, 2, 10**9]]}, "input[0]"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 7}, "dimensions"),
        ({"input": "x", "dimensions": "384"}, "dimensions"),  # a number in a string
        ({"input": "x", "n": 2}, "n"),
        ({"input": "x", "truncate_prompt_tokens": 2}, "truncate_prompt_tokens"),  # specials only
        ({"input": "x", "truncate_prompt_tokens": 10**6}, "truncate_prompt_tokens"),
        ({}, "model"),
    ],
)
def test_bad_input_is_400_naming_the_field(
    kiln_up: Any, payload: dict[str, Any], field: str
) -> None:
    pids = [p.pid for p in kiln_up.workers()]
    r = httpx.post(
        f"{kiln_up.base_url}/v1/embeddings",
        json={"model": MODEL, **payload} if payload else {},
        headers={"authorization": f"Bearer {kiln_up.key}"},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field, error
    assert field.split("[", maxsplit=1)[0] in error["message"]
    ok = httpx.post(
        f"{kiln_up.base_url}/v1/embeddings",
        json={"model": MODEL, "input": "still fine"},
        headers={"authorization": f"Bearer {kiln_up.key}"},
    )
    assert ok.status_code == 200
    assert [p.pid for p in kiln_up.workers()] == pids


def test_a_request_of_2048_inputs_is_served(client: openai.OpenAI) -> None:
    """OpenAI's per-request limit; the worker's queue (``KILN_WORKER_MAX_QUEUE``) holds it."""
    texts = [f"item {i}" for i in range(2048)]
    out = client.embeddings.create(model=MODEL, input=texts)
    assert [d.index for d in out.data] == list(range(2048))
    assert (
        out.data[7].embedding
        == client.embeddings.create(model=MODEL, input="item 7").data[0].embedding
    )


def _post(kiln_up: Any, path: str, body: dict[str, Any], under: str = "/v1") -> httpx.Response:
    return httpx.post(f"{kiln_up.base_url}{under}/{path}", json={"model": MODEL, **body},
                      headers={"authorization": f"Bearer {kiln_up.key}"}, timeout=30)  # fmt: skip


def test_score_and_rerank_give_the_source_models_cosines(kiln_up: Any) -> None:
    """vLLM's ``/v1/score`` (1:N and N:N) and the Jina/Cohere ``/v1/rerank`` on an embeddings
    model: cosines of sentence-transformers' own vectors, ranked, the best ``top_n``."""
    ref = json.loads(FIXTURE.read_text())
    texts, vecs = ref["sentences"], [np.asarray(v) for v in ref["embeddings"]]
    want = [_cos(vecs[0], v) for v in vecs[1:]]
    one_to_n = _post(kiln_up, "score", {"text_1": texts[0], "text_2": texts[1:]}).json()
    assert [d["index"] for d in one_to_n["data"]] == list(range(len(want)))
    assert np.allclose([d["score"] for d in one_to_n["data"]], want, atol=1e-4)
    pairs = _post(kiln_up, "score", {"text_1": texts[:4], "text_2": texts[4:]}).json()["data"]
    assert np.allclose([d["score"] for d in pairs],
                       [_cos(vecs[i], vecs[4 + i]) for i in range(4)], atol=1e-4)  # fmt: skip
    ranked = _post(kiln_up, "rerank", {"query": texts[0], "documents": texts[1:], "top_n": 3})
    body = ranked.json()
    best = sorted(range(len(want)), key=lambda j: -want[j])[:3]
    assert [r["index"] for r in body["results"]] == best
    assert [r["document"]["text"] for r in body["results"]] == [texts[1 + j] for j in best]
    assert np.allclose([r["relevance_score"] for r in body["results"]],
                       [want[j] for j in best], atol=1e-4)  # fmt: skip
    embedded = _post(kiln_up, "embeddings", {"input": texts}).json()["usage"]
    assert body["usage"]["total_tokens"] == embedded["total_tokens"]
    bare = _post(kiln_up, "rerank", {"query": texts[0], "documents": [{"text": texts[2]}],
                                     "return_documents": False}).json()  # fmt: skip
    assert bare["results"] == [{"index": 0, "relevance_score": pytest.approx(want[1], abs=1e-4)}]
    # vLLM's own paths are at the root: the same answers
    root = _post(kiln_up, "score", {"text_1": texts[0], "text_2": texts[1:]}, under="").json()
    assert [d["score"] for d in root["data"]] == [d["score"] for d in one_to_n["data"]]
    root = _post(kiln_up, "rerank", {"query": texts[0], "documents": texts[1:], "top_n": 3},
                 under="").json()  # fmt: skip
    assert root["results"] == body["results"]
    wrong = _post(kiln_up, "score", {"text_1": [], "text_2": "c"}, under="")
    assert (wrong.status_code, wrong.json()["error"]["param"]) == (400, "text_1")  # OpenAI's shape


def test_the_cohere_sdk_reranks_at_v1_and_v2(kiln_up: Any) -> None:
    """Cohere's own SDK: its v2 client at ``/v2/rerank`` (with ``max_tokens_per_doc`` cutting a
    document past the model's context), its v1 client at ``/v1/rerank``."""
    ref = json.loads(FIXTURE.read_text())
    texts, vecs = ref["sentences"], [np.asarray(v) for v in ref["embeddings"]]
    want = [_cos(vecs[0], v) for v in vecs[1:]]
    best = sorted(range(len(want)), key=lambda j: -want[j])[:3]
    v2 = cohere.ClientV2(api_key=kiln_up.key, base_url=kiln_up.base_url)
    ranked = v2.rerank(model=MODEL, query=texts[0], documents=texts[1:], top_n=3)
    assert [r.index for r in ranked.results] == best
    assert [r.relevance_score for r in ranked.results] == pytest.approx(
        [want[j] for j in best], abs=1e-4
    )
    own = _post(kiln_up, "embeddings", {"input": texts[1]}).json()["usage"]["prompt_tokens"] - 2
    long = f"{texts[1]} {'filler ' * 600}"  # past the 512 tokens of the model
    with pytest.raises(cohere.BadRequestError) as too_long:
        v2.rerank(model=MODEL, query=texts[0], documents=["a", long])
    assert too_long.value.body["error"]["param"] == "documents[1]"
    cut = v2.rerank(model=MODEL, query=texts[0], documents=["a", long], max_tokens_per_doc=own)
    assert cut.results[0].index == 1
    assert cut.results[0].relevance_score == pytest.approx(want[0], abs=1e-4)  # texts[1]'s own
    assert cut.results[0].model_dump()["document"] == {"text": long}  # vLLM's: as it was given
    with pytest.raises(cohere.BadRequestError) as none:
        v2.rerank(model=MODEL, query=texts[0], documents=["a"], max_tokens_per_doc=0)
    assert none.value.body["error"]["param"] == "max_tokens_per_doc"
    v1 = cohere.Client(api_key=kiln_up.key, base_url=kiln_up.base_url)
    old = v1.rerank(model=MODEL, query=texts[0], documents=[{"text": t} for t in texts[1:]],
                    top_n=3, return_documents=True)  # fmt: skip
    assert [(r.index, r.document.text if r.document else None) for r in old.results] == [
        (j, texts[1 + j]) for j in best
    ]
    # Cohere v1's structured documents: the ranked fields as "key: value" lines, the rest kept
    docs = [{"title": f"t{j}", "body": t, "id": j} for j, t in enumerate(texts[1:4])]
    fields = v1.rerank(model=MODEL, query=texts[0], documents=docs, rank_fields=["title", "body"],
                       return_documents=True)  # fmt: skip
    lines = [f"title: t{j}\nbody: {t}" for j, t in enumerate(texts[1:4])]
    data = _post(kiln_up, "embeddings", {"input": [texts[0], *lines]}).json()["data"]
    query, *rest = (np.asarray(d["embedding"]) for d in data)
    own = [_cos(query, v) for v in rest]
    assert [r.index for r in fields.results] == sorted(range(3), key=lambda j: -own[j])
    assert [r.relevance_score for r in fields.results] == pytest.approx(
        sorted(own, reverse=True), abs=1e-4
    )
    given = fields.results[0].model_dump()["document"]  # the SDK's model adds "text": None
    assert {key: given[key] for key in docs[0]} == docs[fields.results[0].index]


def test_the_cohere_sdk_embeds_at_v1_and_v2(kiln_up: Any) -> None:
    """Cohere's SDK embeds: floats equal to sentence-transformers' (its v2 and v1 clients), the
    signs packed as ``binary``/``ubinary``, ``truncate`` cutting a text past the context from
    the end it names (``NONE``: a 400 naming it), what Kiln does not serve a 400 naming it."""
    ref = json.loads(FIXTURE.read_text())
    texts, vecs = ref["sentences"][:3], np.asarray(ref["embeddings"][:3])
    v2 = cohere.ClientV2(api_key=kiln_up.key, base_url=kiln_up.base_url)
    got: Any = v2.embed(model=MODEL, texts=texts, input_type="search_document",
                   embedding_types=["float", "ubinary", "binary"])  # fmt: skip
    floats = np.asarray(got.embeddings.float_)
    assert float(np.max(np.abs(floats - vecs))) < 1e-4
    signs = np.packbits(vecs > 0, axis=-1)
    assert got.embeddings.ubinary == signs.tolist()
    assert got.embeddings.binary == (signs.astype(int) - 128).tolist()
    assert got.texts == texts
    openai_usage = _post(kiln_up, "embeddings", {"input": texts}).json()["usage"]
    assert got.meta.billed_units.input_tokens == openai_usage["prompt_tokens"]
    v1 = cohere.Client(api_key=kiln_up.key, base_url=kiln_up.base_url)
    old = v1.embed(model=MODEL, texts=texts, input_type="search_query")
    assert old.response_type == "embeddings_floats"
    assert float(np.max(np.abs(np.asarray(old.embeddings) - vecs))) < 1e-4
    long = f"{texts[0]} {'filler ' * 600}"  # past the 512 tokens of the model
    longs = [long, f"{long} zebra crossing"]  # the same first 512 tokens, not the same last
    head: Any = v2.embed(model=MODEL, texts=longs, input_type="search_document").embeddings.float_
    assert head[0] == pytest.approx(head[1], abs=1e-6)  # END, the default: its start kept
    tail: Any = v2.embed(model=MODEL, texts=longs, input_type="search_document", truncate="START")
    last = _post(kiln_up, "embeddings", {"input": longs, "truncate_prompt_tokens": -1}).json()
    for got_row, want in zip(tail.embeddings.float_, last["data"], strict=True):
        assert got_row == pytest.approx(want["embedding"], abs=1e-6)  # vLLM's: its end kept
    assert _cos(np.asarray(tail.embeddings.float_[1]), np.asarray(head[1])) < 0.99
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"texts": ["a", long], "truncate": "NONE"}, "texts[1]"),
        ({"texts": ["a"], "embedding_types": ["float", "int8"]}, "embedding_types[1]"),
        ({"texts": ["a"], "output_dimension": 256}, "output_dimension"),
        ({"texts": ["a"], "max_tokens": 0}, "max_tokens"),
        ({"images": ["data:image/png;base64,AA=="]}, "images"),
        ({"texts": []}, "texts"),
        ({"texts": ["a", ""]}, "texts[1]"),
    ]
    for fields, param in refusals:
        with pytest.raises(cohere.BadRequestError) as refused:
            v2.embed(model=MODEL, input_type="search_document", **fields)
        assert refused.value.body["error"]["param"] == param, fields


@pytest.mark.parametrize(
    ("path", "payload", "field"),
    [
        ("score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2"),
        ("score", {"text_1": [], "text_2": "c"}, "text_1"),
        ("score", {"text_1": "a", "text_2": ["c", ""]}, "text_2[1]"),
        ("rerank", {"query": "q", "documents": []}, "documents"),
        ("rerank", {"query": "q", "documents": ["a", "word " * 600]}, "documents[1]"),
        ("rerank", {"query": "", "documents": ["a"]}, "query"),
        ("rerank", {"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
        ("rerank", {"query": "q", "documents": [{"title": "t"}]}, "documents[0].text"),
        (
            "rerank",
            {"query": "q", "documents": [{"text": "a"}], "rank_fields": ["text", "title"]},
            "documents[0].title",
        ),
        ("rerank", {"query": "q", "documents": [{"text": "a"}], "rank_fields": []}, "rank_fields"),
        ("rerank", {"query": "q", "documents": ["a"] * 2048}, "documents"),
        ("rerank", {"query": "q", "documents": ["a"], "model": "nope"}, "model"),
    ],
)
def test_score_and_rerank_bad_input_is_4xx_naming_the_field(
    kiln_up: Any, path: str, payload: dict[str, Any], field: str
) -> None:
    pids = [p.pid for p in kiln_up.workers()]
    r = _post(kiln_up, path, payload)
    assert r.status_code == (404 if field == "model" else 400), r.text
    assert r.json()["error"]["param"] == field, r.text
    assert _post(kiln_up, path, {"query": "q", "documents": ["a"]} if path == "rerank"
                 else {"text_1": "q", "text_2": "a"}).status_code == 200  # fmt: skip
    assert [p.pid for p in kiln_up.workers()] == pids


def test_health_ready_and_metrics(kiln_up: Any) -> None:
    assert httpx.get(f"{kiln_up.base_url}/healthz").text == "ok"
    ready = httpx.get(f"{kiln_up.base_url}/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"database": True, "degraded": False}
    served = httpx.post(
        f"{kiln_up.base_url}/v1/embeddings",
        json={"model": MODEL, "input": "counted per tenant"},
        headers={"authorization": f"Bearer {kiln_up.key}"},
    )
    assert served.status_code == 200
    metrics = httpx.get(f"{kiln_up.base_url}/metrics").text  # anonymous, no token configured
    assert "kiln_requests_total" in metrics
    desired = r'^kiln_pool_replicas\{model="all-minilm-l6-v2",state="desired"'
    assert re.search(desired, metrics, re.M)  # KEDA's query needs no token
    assert kiln_up.env["TEST_TENANT_ID"] not in metrics
    assert "tenant=" not in metrics


def test_killed_worker_gives_prompt_503_then_recovers(kiln_up: Any) -> None:
    (worker,) = kiln_up.workers()
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    statuses, slowest = [], 0.0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        start = time.monotonic()
        r = httpx.post(
            f"{kiln_up.base_url}/v1/embeddings",
            json={"model": MODEL, "input": "are you back?"},
            headers={"authorization": f"Bearer {kiln_up.key}"},
            timeout=30,
        )
        slowest = max(slowest, time.monotonic() - start)
        statuses.append(r.status_code)
        if r.status_code == 200:
            break
        assert r.status_code == 503, r.text
        assert int(r.headers["retry-after"]) >= 1
        time.sleep(0.05)
    assert statuses[-1] == 200
    assert 503 in statuses
    assert slowest < 2.0
    (restarted,) = kiln_up.workers()
    assert restarted.pid != worker.pid


def test_admin_cli_works_while_up(kiln_up: Any) -> None:
    kiln_up.cli("tenants", "create", "beta")
    key = kiln_up.new_key("beta", "--name", "ci")
    assert MODEL in kiln_up.cli("models", "list")
    client = openai.OpenAI(base_url=f"{kiln_up.base_url}/v1", api_key=key, max_retries=0)
    assert len(client.embeddings.create(model=MODEL, input="hi").data[0].embedding) == 384


def test_sigterm_stops_the_whole_tree(kiln_up: Any) -> None:
    """Runs last in this module: SIGTERM ends ``kiln up`` and its workers cleanly."""
    workers = kiln_up.workers()
    assert workers
    kiln_up.proc.send_signal(signal.SIGTERM)
    assert kiln_up.proc.wait(timeout=60) == 0
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive
