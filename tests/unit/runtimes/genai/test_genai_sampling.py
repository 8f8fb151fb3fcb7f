"""Greedy, seeded and nucleus sampling on made-up logits."""

from __future__ import annotations

import numpy as np
import pytest

from kiln_runtimes.backends._genai_sampling import Sampler, draw, nucleus, unnormalized


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
