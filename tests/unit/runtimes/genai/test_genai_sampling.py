"""Greedy, seeded and nucleus sampling on made-up logits."""

from __future__ import annotations

import numpy as np
import pytest

from kiln_runtimes.backends._genai_logits import Processor, Shaping, largest, token_logprobs
from kiln_runtimes.backends._genai_sampling import Sampler, draw, nucleus, unnormalized
from kiln_runtimes.protocol import ThinkBudget


def logits(size: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, size).astype(np.float32)


def test_temperature_zero_is_argmax() -> None:
    row = logits()
    assert Sampler(0.0, 0.5, None).sample(row) == int(np.argmax(row))


def test_same_seed_same_tokens_and_different_seed_differs() -> None:
    row = logits(seed=1)
    runs = [Sampler(0.8, 0.95, seed) for seed in (42, 42, 43)]
    tokens = [[sampler.sample(row) for _ in range(20)] for sampler in runs]
    assert tokens[0] == tokens[1]
    assert tokens[0] != tokens[2]


@pytest.mark.parametrize("top_p", [0.01, 0.3, 0.9, 0.999, 1.0])
def test_nucleus_matches_a_full_sort(top_p: float) -> None:
    weights = unnormalized(logits(5000, seed=2), 1.5)
    probs = weights / weights.sum(dtype=np.float64)
    order = np.argsort(-probs, kind="stable")
    count = int(np.searchsorted(np.cumsum(probs[order]), top_p)) + 1
    assert set(nucleus(weights, top_p).tolist()) == set(order[:count].tolist())


def test_nucleus_widens_when_the_first_guess_is_short() -> None:
    weights = np.ones(4096, dtype=np.float32)  # flat: 64 candidates hold ~1.6% of the mass
    assert len(nucleus(weights, 0.5)) == 2048


def test_top_p_samples_only_inside_the_nucleus() -> None:
    row = logits(seed=3)
    allowed = set(nucleus(unnormalized(row, 1.0), 0.5).tolist())
    sampler = Sampler(1.0, 0.5, 7)
    assert {sampler.sample(row) for _ in range(200)} <= allowed


def test_draw_follows_the_distribution() -> None:
    probs = np.array([0.1, 0.2, 0.7])
    rng = np.random.default_rng(0)
    counts = np.bincount([draw(probs, rng.random()) for _ in range(5000)], minlength=3)
    assert np.allclose(counts / 5000, probs, atol=0.03)


@pytest.mark.parametrize(("temperature", "top_p"), [(-0.1, 1.0), (1.0, 0.0), (1.0, 1.5)])
def test_invalid_parameters_raise(temperature: float, top_p: float) -> None:
    with pytest.raises(ValueError, match="temperature"):
        Sampler(temperature, top_p, None)


def test_blocked_draw_matches_a_flat_inverse_cdf() -> None:
    weights = unnormalized(logits(49152, seed=4), 1.0)
    cumulative = np.cumsum(weights, dtype=np.float64)
    for u in np.random.default_rng(5).random(200):
        expected = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
        assert abs(draw(weights, float(u)) - expected) <= 1  # equal up to float rounding


def _log_softmax(row: np.ndarray) -> np.ndarray:
    shifted = row.astype(np.float64) - row.max()
    out: np.ndarray = shifted - np.log(np.exp(shifted).sum())
    return out


def test_plain_shaping_draws_exactly_what_the_old_sampler_drew() -> None:
    row = logits(seed=6)
    old = [Sampler(0.9, 0.8, 11).sample(row)]
    shaped = Sampler(0.9, 0.8, 11, Shaping(top_k=0, min_p=0.0), [1, 2])
    assert [shaped.sample(row)] == old


def test_logprobs_are_the_raw_log_softmax_with_the_chosen_token_top_1_when_greedy() -> None:
    row = logits(seed=7)
    sampler = Sampler(0.0, 1.0, None, Shaping(logprobs=5, logit_bias={3: 2.0}))
    token = sampler.sample(row)
    (entry,) = sampler.take_logprobs(1) or []
    expected = _log_softmax(row)  # raw: before bias and temperature
    assert entry.logprob == pytest.approx(expected[token], abs=1e-5)
    assert entry.top_ids == np.argsort(-expected, kind="stable")[:5].tolist()
    assert np.allclose(entry.top_logprobs, expected[entry.top_ids], atol=1e-5)
    assert all(v <= 0 for v in entry.top_logprobs)
    assert sampler.take_logprobs(0) == []


def test_logprobs_none_when_not_asked_and_stop_tokens_dropped() -> None:
    row = logits(seed=8)
    assert Sampler(0.0, 1.0, None).take_logprobs(1) is None
    sampler = Sampler(0.0, 1.0, None, Shaping(logprobs=0))
    sampler.sample(row)
    assert sampler.take_logprobs(0) == []  # the step's token was a stop token


def test_logit_bias_minus_100_removes_the_greedy_token() -> None:
    row = logits(seed=9)
    best = int(np.argmax(row))
    biased = Sampler(0.0, 1.0, None, Shaping(logit_bias={best: -100.0}))
    assert biased.sample(row) != best
    sampled = Sampler(1.0, 1.0, 3, Shaping(logit_bias={best: -100.0}))
    assert best not in {sampled.sample(row) for _ in range(300)}


def test_min_tokens_hold_the_ending_tokens_back_until_enough_are_drawn() -> None:
    row = np.array([0.0, 3.0, 1.0, 2.0], dtype=np.float32)  # 1 ends the sequence
    sampler = Sampler(0.0, 1.0, None, Shaping(min_tokens=2, held=frozenset({1})))
    assert [sampler.sample(row) for _ in range(3)] == [3, 3, 1]
    assert Shaping(min_tokens=2).processes is False  # nothing to hold: the plain draw


def test_frequency_and_presence_penalties_follow_openai() -> None:
    row = np.zeros(8, dtype=np.float32)
    processor = Processor(Shaping(presence_penalty=0.5, frequency_penalty=0.25), [])
    for token in (2, 2, 5):
        processor.record(token)
    out = processor.apply(row)
    assert out[2] == pytest.approx(-(2 * 0.25 + 0.5))
    assert out[5] == pytest.approx(-(0.25 + 0.5))
    assert out[[0, 1, 3, 4, 6, 7]].tolist() == [0.0] * 6
    assert row.tolist() == [0.0] * 8  # the model's row is untouched


def test_repetition_penalty_covers_prompt_and_output_like_vllm() -> None:
    row = np.array([2.0, -2.0, 2.0, -2.0, 1.0], dtype=np.float32)
    processor = Processor(Shaping(repetition_penalty=2.0), [0, 1])
    processor.record(2)
    assert processor.apply(row).tolist() == [1.0, -4.0, 1.0, -2.0, 1.0]


def test_penalty_steers_greedy_away_from_a_repeated_token() -> None:
    row = np.array([1.0, 0.9, 0.0], dtype=np.float32)
    sampler = Sampler(0.0, 1.0, None, Shaping(frequency_penalty=0.2))
    assert [sampler.sample(row) for _ in range(3)] == [0, 1, 0]


def test_top_k_draws_exactly_within_the_k_most_probable() -> None:
    row = logits(seed=10)
    allowed = set(np.argsort(-row)[:5].tolist())
    sampler = Sampler(1.5, 1.0, 4, Shaping(top_k=5))
    drawn = {sampler.sample(row) for _ in range(400)}
    assert drawn == allowed


def test_min_p_keeps_exactly_the_tokens_above_the_threshold() -> None:
    row = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05], dtype=np.float32))
    sampler = Sampler(1.0, 1.0, 5, Shaping(min_p=0.3))  # keeps p >= 0.3 * 0.4 = 0.12
    assert {sampler.sample(row) for _ in range(400)} == {0, 1, 2}


def test_top_k_min_p_and_top_p_compose() -> None:
    row = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05], dtype=np.float32))
    sampler = Sampler(1.0, 0.6, 5, Shaping(top_k=4, min_p=0.2))
    assert {sampler.sample(row) for _ in range(400)} == {0, 1}


@pytest.mark.parametrize(
    "shaping", [Shaping(top_k=-1), Shaping(min_p=1.5), Shaping(logprobs=21),
                Shaping(repetition_penalty=0.0)],
)  # fmt: skip
def test_invalid_shaping_raises(shaping: Shaping) -> None:
    with pytest.raises(ValueError, match="must be"):
        Sampler(1.0, 1.0, None, shaping)


def test_a_scored_tokens_rank_counts_the_more_probable_tokens() -> None:
    logits = np.asarray([0.5, 3.0, -1.0, 2.0, 0.5], dtype=np.float32)
    ranks = [token_logprobs(logits, t, 0, rank=True).rank for t in range(5)]
    assert ranks == [3, 1, 5, 2, 3]  # ties share the better place, as vLLM's
    assert token_logprobs(logits, 1, 2).rank == 0  # not asked: not computed


@pytest.mark.parametrize("k", [1, 2, 5, 20, 64, 500])
def test_largest_is_the_k_largest_entries_of_any_row(k: int) -> None:
    """Exact on rows a vocabulary makes (49,152 entries, ties, -inf masks, exp'd weights that
    underflow to 0) and on short ones: the same values as a full sort gives."""
    rng = np.random.default_rng(k)
    logits = rng.standard_normal(49_152).astype(np.float32) * 4
    masked = np.full(49_152, -np.inf, np.float32)
    masked[rng.choice(49_152, 3 * k, replace=False)] = rng.standard_normal(3 * k)
    rows = [
        logits, unnormalized(logits, 0.3), masked, np.round(logits),  # many ties
        np.sort(logits), np.zeros(49_152, np.float32), logits[: k + 3], logits[: max(1, k // 2)],
    ]  # fmt: skip
    for row in rows:
        got = largest(row, k)
        assert len(set(got.tolist())) == got.size == min(k, row.size)
        assert np.array_equal(np.sort(row[got]), np.sort(row)[row.size - got.size :])


OPEN, CLOSE = 7, 8


@pytest.mark.parametrize(
    ("inside", "drawn", "forced_at"),
    [
        (True, [3, 4, 5], 3),  # the prompt left it open: the 4th token is the close
        (True, [], 0),  # a budget of 0 (no tokens to draw) closes it at once
        (False, [2, OPEN, 3, 4, 5], 5),  # opened by the model: counted from there
        (True, [3, CLOSE, 4, 5, 6, 7], None),  # closed by the model: nothing forced after
        (False, [2, 3, 4, 5, 6], None),  # never opened
    ],
)
def test_a_spent_thinking_budget_forces_the_close(
    inside: bool, drawn: list[int], forced_at: int | None
) -> None:
    budget = 3 if drawn else 0
    processor = Processor(Shaping(think=ThinkBudget(open=OPEN, close=CLOSE, tokens=budget,
                                                    inside=inside)), [1])  # fmt: skip
    row = np.zeros(16, np.float32)
    row[CLOSE] = -100.0  # the model would never close it
    for at, token in enumerate([*drawn, 9]):
        shaped = processor.apply(row)
        forced = bool(np.isneginf(shaped[np.arange(16) != CLOSE]).all())
        assert forced is (at == forced_at), at
        if forced:
            assert int(np.argmax(shaped)) == CLOSE
            break
        processor.record(token)
    processor.record(CLOSE)
    assert not np.isneginf(processor.apply(row)[:CLOSE]).any()  # closed: free again


@pytest.mark.parametrize("budget", [0, 3])
def test_gpt_oss_budget_ends_its_analysis_with_the_final_header(budget: int) -> None:
    """gpt-oss's analysis message, counted from its ``<|message|>`` (right after ``analysis``),
    is ended by ``<|end|>`` once the budget is spent, then the final message's header is drawn,
    whatever the logits; another message opens nothing."""
    from types import SimpleNamespace

    from tokenizers import AddedToken

    from kiln_platform.gateway._harmony import harmony_ids
    from kiln_platform.gateway._sampling import think_budget
    from kiln_platform.gateway.llm_schemas import ChatCompletionRequest
    from tests.factories import byte_bpe

    tok = byte_bpe(["analysis assistant final hmm so", "It is sunny"] * 20)
    tok.add_special_tokens([AddedToken(m, special=True) for m in
                            ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")])  # fmt: skip
    model = SimpleNamespace(harmony=harmony_ids(tok), think=None, reasons=True, tokenizer=tok)
    asked = ChatCompletionRequest(model="m", messages=[], thinking_token_budget=budget)
    made = think_budget(asked, model, [1])  # type: ignore[arg-type]
    assert made is not None
    ids = tok.encode("<|message|>so<|channel|>analysis<|message|>hmm so hmm so hmm so",
                     add_special_tokens=False).ids  # fmt: skip
    processor, vocab = Processor(Shaping(think=made), [1]), tok.get_vocab_size()
    row, drawn = np.zeros(vocab, np.float32), list[int]()
    for given in [*ids, *[ids[-1]] * 10]:
        shaped = processor.apply(row)
        forced = np.isneginf(shaped).sum() == vocab - 1
        token = int(np.argmax(shaped)) if forced else given
        processor.record(token)
        drawn.append(token)
    text = tok.decode(drawn, skip_special_tokens=False)
    head = "<|message|>so<|channel|>analysis<|message|>"
    assert text.startswith(head), text
    thought = text[len(head) :].split("<|end|>")[0]
    assert len(tok.encode(thought, add_special_tokens=False).ids) == budget, text
    assert "<|end|><|start|>assistant<|channel|>final<|message|>" in text, text
    assert text.count("<|end|>") == 1, text
