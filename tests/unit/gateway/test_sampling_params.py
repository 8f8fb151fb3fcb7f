"""Sampling parameters of chat and text completions: ranges, defaults and per-choice seeds."""

from __future__ import annotations

from typing import Any

import pytest

from kiln_platform.errors import BadRequest
from kiln_platform.gateway._prompts import max_tokens
from kiln_platform.gateway._sampling import MAX_N, sampling
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest, CompletionRequest

VOCAB = 1000


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[], **fields)


def test_defaults_are_the_worker_protocol_defaults() -> None:
    plan = sampling(chat(), VOCAB)
    assert plan.n == 1
    assert plan.fields == {
        "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0,
        "frequency_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": {}, "logprobs": None,
        "stop_token_ids": [], "ignore_eos": False, "min_tokens": 0, "prompt_logprobs": None,
    }  # fmt: skip


def test_the_models_defaults_fill_what_the_request_leaves_out() -> None:
    """vLLM's ``--generation-config auto``: the model's generation_config.json values are the
    defaults; a value the request gives, 0 too, wins."""
    qwen = {"temperature": 0.7, "top_p": 0.8, "top_k": 20.0, "repetition_penalty": 1.05}
    fields = sampling(chat(), VOCAB, defaults=qwen).fields
    assert (fields["temperature"], fields["top_p"], fields["top_k"]) == (0.7, 0.8, 20)
    assert (fields["repetition_penalty"], fields["min_p"]) == (1.05, 0.0)
    fields = sampling(chat(temperature=0, top_k=-1, top_p=1.0), VOCAB, defaults=qwen).fields
    assert (fields["temperature"], fields["top_k"], fields["top_p"]) == (0.0, 0, 1.0)
    assert fields["repetition_penalty"] == 1.05


def test_the_models_max_new_tokens_bounds_a_request_that_gives_none() -> None:
    """transformers' ``generate`` makes ``max_new_tokens`` when a call names none; vLLM's
    default is that too. A request's own ``max_tokens`` wins."""
    plan = sampling(chat(), VOCAB, defaults={"max_tokens": 256.0})
    assert plan.most == 256.0
    assert max_tokens(chat(), 100, 4096, plan.most) == 256  # not the 3996 left in the context
    assert max_tokens(chat(), 4000, 4096, plan.most) == 96
    assert max_tokens(chat(max_tokens=1000), 100, 4096, plan.most) == 1000
    assert max_tokens(CompletionRequest(model="m", prompt="a"), 10, 4096, 8.0) == 8
    assert max_tokens(chat(), 100, 4096) == 3996


def test_choice_seeds_keep_choice_0_and_differ_reproducibly() -> None:
    plan = sampling(chat(n=4, seed=5), VOCAB)
    seeds = [plan.seed_of(i) for i in range(4)]
    assert seeds[0] == 5
    assert len(set(seeds)) == 4
    assert all(s is not None and s >= 0 for s in seeds)
    assert seeds == [sampling(chat(n=4, seed=5), VOCAB).seed_of(i) for i in range(4)]
    assert sampling(chat(n=2), VOCAB).seed_of(1) is None


def test_logprobs_shapes() -> None:
    assert sampling(chat(logprobs=True), VOCAB).fields["logprobs"] == 0
    assert sampling(chat(logprobs=True, top_logprobs=5), VOCAB).fields["logprobs"] == 5
    assert sampling(chat(logprobs=False, top_logprobs=0), VOCAB).fields["logprobs"] is None
    text = CompletionRequest(model="m", prompt="x", logprobs=3)
    assert sampling(text, VOCAB).fields["logprobs"] == 3
    assert sampling(text, VOCAB).fields["prompt_logprobs"] is None
    echoed = CompletionRequest(model="m", prompt="x", logprobs=3, echo=True)
    assert sampling(echoed, VOCAB).fields["prompt_logprobs"] == 3  # the worker scores the prompt
    echo_only = CompletionRequest(model="m", prompt="x", echo=True)
    assert sampling(echo_only, VOCAB).fields["prompt_logprobs"] is None
    both = CompletionRequest(model="m", prompt="x", logprobs=1, echo=True, prompt_logprobs=4)
    assert sampling(both, VOCAB).fields["prompt_logprobs"] == 4  # the more alternatives
    assert sampling(chat(prompt_logprobs=0), VOCAB).fields["prompt_logprobs"] == 0


def test_top_p_0_is_the_most_probable_token_alone() -> None:
    plan = sampling(chat(top_p=0, top_k=40), VOCAB)
    assert (plan.fields["top_p"], plan.fields["top_k"]) == (1.0, 1)


def test_logit_bias_keys_become_token_ids_and_top_k_minus_1_is_off() -> None:
    plan = sampling(chat(logit_bias={"7": -100, "12": 5.5}, top_k=-1), VOCAB)
    assert plan.fields["logit_bias"] == {7: -100.0, 12: 5.5}
    assert plan.fields["top_k"] == 0


@pytest.mark.parametrize(
    ("fields", "param", "prompts"),
    [
        ({"n": MAX_N + 1}, "n", 1),
        ({"n": 8}, "n", 9),  # 72 sequences
        ({"logit_bias": {"abc": 1}}, "logit_bias", 1),
        ({"logit_bias": {"\u00b2": 1}}, "logit_bias", 1),
        ({"logit_bias": {str(VOCAB): 1}}, "logit_bias", 1),
        ({"top_logprobs": 2}, "top_logprobs", 1),
        ({"presence_penalty": -2.1}, "presence_penalty", 1),
        ({"min_p": -0.1}, "min_p", 1),
        ({"repetition_penalty": 2.5}, "repetition_penalty", 1),
        ({"top_p": 1.01}, "top_p", 1),
        ({"top_p": -0.1}, "top_p", 1),
        ({"stop_token_ids": [VOCAB]}, "stop_token_ids", 1),
        ({"stop_token_ids": list(range(65))}, "stop_token_ids", 1),
        ({"min_tokens": -1}, "min_tokens", 1),
        ({"min_tokens": 9, "max_tokens": 8}, "min_tokens", 1),
        ({"min_tokens": 9, "max_completion_tokens": 8}, "min_tokens", 1),
        ({"prompt_logprobs": 21}, "prompt_logprobs", 1),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs", 1),  # as vLLM
    ],
)
def test_out_of_range_names_the_field(fields: dict[str, Any], param: str, prompts: int) -> None:
    with pytest.raises(BadRequest) as err:
        sampling(chat(**fields), VOCAB, prompts)
    assert err.value.param == param
    assert f"'{param}'" in err.value.message


def test_stop_tokens_are_the_models_and_the_requests_unless_eos_is_ignored() -> None:
    eos = {2, 3}
    kept = sampling(chat(stop_token_ids=[9]), VOCAB, eos=eos).fields
    assert (kept["stop_token_ids"], kept["ignore_eos"]) == ([2, 3, 9], False)
    ignored = sampling(chat(stop_token_ids=[9], ignore_eos=True, min_tokens=4), VOCAB, eos=eos)
    assert ignored.fields["stop_token_ids"] == [9]
    assert (ignored.fields["ignore_eos"], ignored.fields["min_tokens"]) == (True, 4)


@pytest.mark.parametrize("fields", [{"ignore_eos": True}, {"min_tokens": 2}])
def test_a_grammar_ends_the_answer_itself(fields: dict[str, Any]) -> None:
    """Structured outputs and required tool calls end on a stop token once the grammar is
    whole: neither field can be kept with one."""
    with pytest.raises(BadRequest) as err:
        sampling(chat(**fields), VOCAB, eos={2}, grammar="{}")
    assert err.value.param == next(iter(fields))
    assert sampling(chat(**fields), VOCAB, eos={2}).fields[next(iter(fields))]
