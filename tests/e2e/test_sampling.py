"""OpenAI/vLLM sampling parameters through the official openai SDK against a real SmolLM2 worker:
``n``, prompt lists, ``echo``, logprobs, logit bias, penalties, ``top_k`` and ``min_p``, and
vLLM's length controls (``ignore_eos``, ``min_tokens``, ``stop_token_ids``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from kiln_platform.db.database import open_database
from kiln_platform.db.tables import UsageEvent
from kiln_platform.settings import Settings

MODEL = "smollm2-135m-instruct"
PARIS: Any = [{"role": "user", "content": "What is the capital of France?"}]
BRIEF: Any = [{"role": "system", "content": "Be brief."}, *PARIS]
"""Answered in a few words and an end-of-sequence token."""


@pytest.fixture(scope="module")
def client(llm_up: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{llm_up.base_url}/v1", api_key=llm_up.key, max_retries=0)


def _chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.with_raw_response.create(
        model=MODEL, messages=kwargs.pop("messages", PARIS), **kwargs
    )


def _ledger_row(llm_up: Any, request_id: str) -> Any:
    async def row() -> Any:
        settings = Settings(data_dir=llm_up.env["KILN_DATA_DIR"])
        async with open_database(settings) as db, db.sessions() as s:
            return await s.scalar(select(UsageEvent).where(UsageEvent.request_id == request_id))

    deadline = time.monotonic() + 5
    while (event := asyncio.run(row())) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return event


def test_n_with_a_seed_gives_n_reproducible_choices_billed_once(
    client: openai.OpenAI, llm_up: Any
) -> None:
    args = {"n": 3, "seed": 7, "temperature": 1.0, "max_tokens": 8}
    raw = _chat(client, **args)
    first, again = raw.parse(), _chat(client, **args).parse()
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in again.choices]
    assert len(set(texts)) > 1  # each choice has its own seed
    one = _chat(client, seed=7, temperature=1.0, max_tokens=8).parse()
    assert one.choices[0].message.content == texts[0]  # choice 0 keeps the request's seed
    assert first.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt is billed once
    assert 3 <= first.usage.completion_tokens <= 24
    event = _ledger_row(llm_up, raw.headers["x-request-id"])
    assert event is not None
    assert (event.input_tokens, event.output_tokens) == (
        first.usage.prompt_tokens, first.usage.completion_tokens,
    )  # fmt: skip


def test_greedy_logprobs_top_1_is_the_chosen_token(client: openai.OpenAI) -> None:
    resp = _chat(client, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3).parse()
    choice = resp.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == resp.usage.completion_tokens - (choice.finish_reason == "stop")
    for entry in entries:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
    assert b"".join(bytes(e.bytes) for e in entries).decode() == choice.message.content
    plain = _chat(client, temperature=0, max_tokens=8).parse()
    assert plain.choices[0].message.content == choice.message.content  # same greedy answer


def test_logit_bias_minus_100_removes_a_token_of_the_greedy_answer(
    client: openai.OpenAI, smollm2_dir: Any
) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    greedy = _chat(client, temperature=0, max_tokens=8, logprobs=True).parse()
    entries = greedy.choices[0].logprobs.content
    banned = tokenizer.token_to_id(
        "".join(chr(_byte_char(b)) for b in entries[0].bytes)
    )  # the byte-level token of the answer's first token
    assert banned is not None
    biased = _chat(
        client, temperature=0, max_tokens=8, logprobs=True, logit_bias={str(banned): -100}
    ).parse()
    assert all(e.bytes != entries[0].bytes for e in biased.choices[0].logprobs.content)
    assert biased.choices[0].message.content != greedy.choices[0].message.content


def _byte_char(b: int) -> int:
    """GPT-2's byte-level alphabet: the code point a byte-level BPE token uses for byte ``b``."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if b in printable:
        return b
    return 256 + sum(1 for x in range(b) if x not in printable)


def test_vllm_length_controls_end_where_asked(client: openai.OpenAI, smollm2_dir: Any) -> None:
    """``ignore_eos`` runs to ``max_tokens`` (a benchmark's fixed lengths), ``min_tokens`` holds
    the end back (greedy: the same answer, then more), ``stop_token_ids`` ends at a token of the
    caller's (not part of the answer), ``include_stop_str_in_output`` keeps a stop string;
    ``stop_reason`` names the stop met (vLLM's)."""
    from tokenizers import Tokenizer

    greedy = _chat(client, messages=BRIEF, temperature=0, max_tokens=64, logprobs=True).parse()
    said, natural = greedy.choices[0].message.content, greedy.usage.completion_tokens
    assert (greedy.choices[0].finish_reason, natural < 40) == ("stop", True)
    ignored = {"ignore_eos": True}
    fixed = _chat(client, messages=BRIEF, temperature=0, max_tokens=48, extra_body=ignored)
    assert (fixed.parse().usage.completion_tokens, fixed.parse().choices[0].finish_reason) == (
        48, "length")  # fmt: skip
    # a text completion that names no max_tokens makes 16, as OpenAI's and vLLM's
    short = client.completions.create(model=MODEL, prompt="Once upon a time", temperature=0,
                                      extra_body=ignored)  # fmt: skip
    assert short.usage is not None
    assert (short.usage.completion_tokens, short.choices[0].finish_reason) == (16, "length")
    held = {"min_tokens": natural + 5}
    longer = _chat(client, messages=BRIEF, temperature=0, max_tokens=64, extra_body=held).parse()
    assert longer.usage.completion_tokens >= natural + 5
    assert longer.choices[0].message.content.startswith(said)
    third = greedy.choices[0].logprobs.content[2]
    tokenizer = Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    ends = tokenizer.token_to_id("".join(chr(_byte_char(b)) for b in third.bytes))
    assert ends is not None
    cut = _chat(client, messages=BRIEF, temperature=0, max_tokens=64,
                extra_body={"stop_token_ids": [ends]})  # fmt: skip
    stopped = cut.parse().choices[0]
    assert (stopped.finish_reason, stopped.model_extra["stop_reason"]) == ("stop", ends)
    assert greedy.choices[0].model_extra["stop_reason"] is None  # its end-of-sequence token
    assert said.startswith(stopped.message.content)
    assert len(stopped.message.content) < len(said)
    word = said.split()[2]  # the stop string ends the answer, and is kept when asked
    for keep, ends_with in (
        (False, said[: said.index(word)]),
        (True, said[: said.index(word)] + word),
    ):
        kept = {"include_stop_str_in_output": keep}
        cut = _chat(client, messages=BRIEF, temperature=0, max_tokens=64, stop=[word],
                    extra_body=kept).parse()  # fmt: skip
        assert cut.choices[0].message.content == ends_with
        assert cut.choices[0].model_extra["stop_reason"] == word  # vLLM's: the stop met
    chunks = _chat(client, messages=BRIEF, temperature=0, max_tokens=64, stop=[word], stream=True)
    assert [c.choices[0].model_extra["stop_reason"] for c in chunks.parse()
            if c.choices and c.choices[0].finish_reason] == [word]  # fmt: skip


def test_chat_template_kwargs_a_template_does_not_read_change_nothing(
    client: openai.OpenAI,
) -> None:
    plain = _chat(client, temperature=0, max_tokens=12).parse().choices[0].message.content
    extra = {"chat_template_kwargs": {"enable_thinking": False}}
    given = _chat(client, temperature=0, max_tokens=12, extra_body=extra).parse()
    assert given.choices[0].message.content == plain


def test_continue_final_message_goes_on_with_the_answer_begun(client: openai.OpenAI) -> None:
    """Greedy, the model goes on with the first words of its own answer exactly as it went on
    from them when it wrote them (the prompt ends inside the assistant's message)."""
    said = _chat(client, messages=BRIEF, temperature=0, max_tokens=24).parse()
    said = said.choices[0].message.content
    begun = " ".join(said.split()[:3])
    extra = {"continue_final_message": True}
    messages = [*BRIEF, {"role": "assistant", "content": begun}]
    rest = _chat(client, messages=messages, temperature=0, max_tokens=21, extra_body=extra)
    assert begun + rest.parse().choices[0].message.content == said


def test_tokenize_counts_what_a_completion_is_billed_and_detokenize_inverts_it(
    client: openai.OpenAI, llm_up: Any
) -> None:
    """vLLM's ``/tokenize`` and ``/detokenize``: a prompt's ids as the completion tokenizes it
    (its count the billed ``prompt_tokens``), a chat's through the chat template likewise."""
    headers = {"authorization": f"Bearer {llm_up.key}"}

    def call(path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{llm_up.base_url}/{path}", json={"model": MODEL, **body},
                          headers=headers, timeout=30)  # fmt: skip

    text = "The quick brown fox jumps over the lazy dog."
    said = call("tokenize", {"prompt": text, "return_token_strs": True}).json()
    billed: Any = client.completions.create(model=MODEL, prompt=text, max_tokens=1).usage
    assert said["count"] == len(said["tokens"]) == len(said["token_strs"]) == billed.prompt_tokens
    assert said["max_model_len"] == 8192
    assert call("detokenize", {"tokens": said["tokens"]}).json() == {"prompt": text}
    chat = call("tokenize", {"messages": BRIEF}).json()
    assert chat["count"] == _chat(client, messages=BRIEF, max_tokens=1).parse().usage.prompt_tokens
    refused = [
        (call("tokenize", {"prompt": text, "messages": BRIEF}), "prompt"),
        (call("detokenize", {"tokens": [10**9]}), "tokens"),
        (call("tokenize", {"prompt": text, "frobnicate": 1}), "frobnicate"),
    ]
    for r, param in refused:
        assert (r.status_code, r.json()["error"]["param"]) == (400, param)
    assert httpx.post(f"{llm_up.base_url}/tokenize", json={"model": MODEL, "prompt": text},
                      timeout=30).status_code == 401  # fmt: skip


def test_stop_with_n_ends_every_choice_before_the_stop(client: openai.OpenAI) -> None:
    resp = _chat(client, n=2, seed=3, temperature=0.7, max_tokens=30, stop=[" "]).parse()
    assert [c.index for c in resp.choices] == [0, 1]
    for choice in resp.choices:
        assert " " not in choice.message.content
        assert choice.finish_reason in ("stop", "length")


def test_top_k_1_and_min_p_1_sample_the_greedy_answer(client: openai.OpenAI) -> None:
    greedy = _chat(client, temperature=0, max_tokens=12).parse().choices[0].message.content
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        resp = _chat(client, temperature=1.5, seed=11, max_tokens=12, extra_body=extra).parse()
        assert resp.choices[0].message.content == greedy, extra


def test_penalties_change_a_repetitive_greedy_answer(client: openai.OpenAI) -> None:
    def text(**extra: Any) -> str:
        answer: str = (
            client.completions.create(
                model=MODEL,
                prompt=", ".join(["tea"] * 8) + ",",
                temperature=0,
                max_tokens=12,
                **extra,
            )
            .choices[0]
            .text
        )
        return answer

    greedy = text()
    # Repeats, so the penalties have something to act on (the int8 build's greedy answer to four
    # teas is " and more tea.", one; to eight it is six more).
    assert greedy.count("tea") >= 2
    for extra in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        assert text(**extra).count("tea") < greedy.count("tea"), extra
    assert text(extra_body={"repetition_penalty": 1.8}) != greedy  # covers the prompt too


def test_prompt_list_with_n_indexes_prompt_times_n_plus_j(client: openai.OpenAI) -> None:
    prompts = ["The capital of France is", "1, 2, 3,"]
    resp = client.completions.create(model=MODEL, prompt=prompts, n=2, temperature=0, max_tokens=5)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    singles = [
        client.completions.create(model=MODEL, prompt=p, temperature=0, max_tokens=5)
        for p in prompts
    ]
    texts = [c.text for c in resp.choices]
    assert texts == [singles[0].choices[0].text] * 2 + [singles[1].choices[0].text] * 2
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles if s.usage)


def test_a_negative_seed_repeats_as_any_seed(client: openai.OpenAI) -> None:
    """vLLM takes any 64-bit seed, negative ones too (the worker's generator takes none)."""
    args = {"seed": -(2**63), "temperature": 1.0, "max_tokens": 8}
    first, again = _chat(client, **args).parse(), _chat(client, **args).parse()
    assert first.choices[0].message.content == again.choices[0].message.content


def test_a_generous_max_tokens_is_not_turned_away_at_the_default_deadline(llm_up: Any) -> None:
    """Without the SDK's timeout header a request has ``KILN_REQUEST_TIMEOUT_S`` (60 s): 8,000
    tokens would not fit it, but an answer may end at any token, so only what the request
    surely takes is held against it (a 504 before)."""
    body = {"model": MODEL, "messages": BRIEF, "max_tokens": 8000, "temperature": 0}
    r = httpx.post(f"{llm_up.base_url}/v1/chat/completions", json=body, timeout=120,
                   headers={"authorization": f"Bearer {llm_up.key}"})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "stop"


def test_echo_and_text_logprobs(client: openai.OpenAI) -> None:
    prompt = "The capital of France is"
    echoed = client.completions.create(
        model=MODEL, prompt=prompt, echo=True, temperature=0, max_tokens=5
    )
    scored = client.completions.create(
        model=MODEL, prompt=prompt, logprobs=2, temperature=0, max_tokens=5
    )
    text = scored.choices[0].text
    assert echoed.choices[0].text == prompt + text
    logprobs = scored.choices[0].logprobs
    assert logprobs is not None
    assert "".join(logprobs.tokens or []) == text
    assert logprobs.text_offset == [
        sum(len(t) for t in (logprobs.tokens or [])[:i]) for i in range(len(logprobs.tokens or []))
    ]
    for token, top in zip(logprobs.tokens or [], logprobs.top_logprobs or [], strict=True):
        assert max(top, key=top.__getitem__) == token


def test_streamed_n_interleaves_choices_with_logprobs(client: openai.OpenAI) -> None:
    args: dict[str, Any] = {"n": 2, "temperature": 0, "max_tokens": 10}
    whole = _chat(client, **args).parse()
    stream = client.chat.completions.create(
        model=MODEL, messages=PARIS, stream=True, logprobs=True, **args
    )
    texts, tokens, finishes = ["", ""], [0, 0], [None, None]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            tokens[choice.index] += len(choice.logprobs.content or []) if choice.logprobs else 0
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    assert texts == [c.message.content for c in whole.choices]
    assert all(tokens)
    assert all(finishes)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 17}, "n"),
        ({"n": 0}, "n"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"stop_token_ids": [99999999]}, "stop_token_ids"),
        ({"min_tokens": 9}, "min_tokens"),  # above max_tokens
        ({"ignore_eos": True, "response_format": {"type": "json_object"}}, "ignore_eos"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"seed": 2**63}, "seed"),
        ({"truncate_prompt_tokens": 10**6}, "truncate_prompt_tokens"),  # over the context
    ],
)
def test_out_of_range_sampling_is_a_400_naming_the_field(
    client: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=PARIS, max_tokens=4, extra_body=extra)
    body: Any = err.value.body
    assert body["param"] == param, body
    assert param in body["message"]


def test_too_many_prompts_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=["a"] * 17, max_tokens=2)
    body: Any = err.value.body
    assert body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError, match="prune_lm_head") as pruned:  # last logits
        client.completions.create(model=MODEL, prompt="a b", echo=True, logprobs=1, max_tokens=2)
    assert pruned.value.body["param"] == "prompt_logprobs"  # type: ignore[index]  # the worker's


def test_truncate_prompt_tokens_keeps_a_prompts_last_tokens(
    client: openai.OpenAI, llm_up: Any
) -> None:
    """vLLM's ``truncate_prompt_tokens``: a text prompt, or a chat's templated one, keeps its
    last tokens; it is answered as those tokens given alone, counted so, and ``echo`` repeats
    what was kept."""
    prompt = "Once upon a time, in a land far away, there lived a king who loved to count"
    auth = {"Authorization": f"Bearer {llm_up.key}"}
    ids = httpx.post(f"{llm_up.base_url}/tokenize", headers=auth,
                     json={"model": MODEL, "prompt": prompt}).json()["tokens"]  # fmt: skip
    args: dict[str, Any] = {"model": MODEL, "max_tokens": 6, "temperature": 0}
    cut = client.completions.create(prompt=prompt, echo=True, **args,
                                    extra_body={"truncate_prompt_tokens": 6})  # fmt: skip
    alone = client.completions.create(prompt=ids[-6:], **args)
    assert cut.usage is not None
    assert cut.usage.prompt_tokens == 6 < len(ids)
    kept = httpx.post(f"{llm_up.base_url}/detokenize", headers=auth,
                      json={"model": MODEL, "tokens": ids[-6:]}).json()["prompt"]  # fmt: skip
    assert prompt.endswith(kept)
    assert cut.choices[0].text == kept + alone.choices[0].text
    whole = _chat(client, messages=BRIEF, max_tokens=1).parse()
    assert whole.usage is not None
    chat = _chat(client, messages=BRIEF, max_tokens=1,
                 extra_body={"truncate_prompt_tokens": 5}).parse()  # fmt: skip
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == 5 < whole.usage.prompt_tokens
    most = _chat(client, messages=BRIEF, max_tokens=1,
                 extra_body={"truncate_prompt_tokens": -1}).parse()  # fmt: skip
    assert most.usage is not None
    assert most.usage.prompt_tokens == whole.usage.prompt_tokens  # under the context: all


def _twins(llm_up: Any) -> float:
    """Workers the model's background twin (the batch class's pool) is sized to."""
    return sum(
        float(line.split()[-1])
        for line in llm_up.metrics().splitlines()
        if line.startswith("kiln_pool_replicas")
        and f'model="{MODEL}"' in line
        and '+batch"' in line
        and 'state="desired"' in line
    )


def test_service_tier_flex_runs_in_the_batch_class_and_says_so(
    client: openai.OpenAI, llm_up: Any
) -> None:
    """OpenAI's flex processing is Kiln's batch class: the pool's idle-priority twin, priced as a
    batch line. The tier that served a request is in its answer; an explicit tier overrides
    ``x-kiln-priority``."""
    plain = _chat(client, messages=BRIEF, max_tokens=8, temperature=0).parse()
    assert plain.service_tier == "default"
    assert _twins(llm_up) == 0  # nothing of the batch class yet
    flex = _chat(client, messages=BRIEF, max_tokens=8, temperature=0, service_tier="flex").parse()
    assert flex.service_tier == "flex"
    assert _twins(llm_up) == 1  # made for it, on its first request
    assert flex.choices[0].message.content == plain.choices[0].message.content
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=BRIEF, max_tokens=4, stream=True, service_tier="flex",
        stream_options={"include_usage": True},
    ))  # fmt: skip
    assert {c.service_tier for c in chunks} == {"flex"}
    answer = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4,
                                     service_tier="flex")  # fmt: skip
    assert answer.service_tier == "flex"
    lowered = {"x-kiln-priority": "batch"}
    assert _chat(client, max_tokens=2, extra_headers=lowered).parse().service_tier == "flex"
    assert _chat(client, max_tokens=2, extra_headers=lowered,
                 service_tier="priority").parse().service_tier == "default"  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="service_tier"):
        _chat(client, max_tokens=2, service_tier="fast")


def test_continuous_usage_stats_puts_the_usage_so_far_in_every_chunk(
    client: openai.OpenAI,
) -> None:
    """vLLM's ``stream_options.continuous_usage_stats``: with ``include_usage``, each chunk's
    ``usage`` counts what was generated so far; without it, it changes nothing."""
    every: Any = {"include_usage": True, "continuous_usage_stats": True}
    chat = list(client.chat.completions.create(
        model=MODEL, messages=BRIEF, max_tokens=8, temperature=0, stream=True,
        stream_options=every,
    ))  # fmt: skip
    text = list(client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0,
        stream=True, stream_options=every,
    ))  # fmt: skip
    for chunks in (chat, text):
        usages = [c.usage for c in chunks]
        assert all(u is not None for u in usages)
        made = [u.completion_tokens for u in usages if u is not None]
        assert made == sorted(made)
        assert made[0] < made[-1]
        assert len({u.prompt_tokens for u in usages if u is not None}) == 1
        assert chunks[-1].choices == []  # the closing usage chunk, as without it
    quiet: Any = {"continuous_usage_stats": True}
    plain = list(client.chat.completions.create(
        model=MODEL, messages=BRIEF, max_tokens=4, stream=True, stream_options=quiet,
    ))  # fmt: skip
    assert all(c.usage is None for c in plain)
