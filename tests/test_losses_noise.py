"""Noise maths: q₊/q₋ against a Monte-Carlo simulation of flipped labels, the tolerance condition on
hand-computed cases, and the sampler skew η for uniform and distance-preferring samplers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raydist.losses.noise import effective_flip_rates, noise_tolerance, pair_flip_rates, sampler_skew

PAIRS = 400_000


def _flip(rng, labels, p, k):
    """Independent simulation of symmetric noise: with probability p, a uniform draw from the K−1 other
    classes (drawn as a uniform class among all K, redrawn while it equals the true one)."""
    out = labels.copy()
    flip = rng.random(len(labels)) < p
    other = rng.integers(0, k, len(labels))
    same = flip & (other == labels)
    while same.any():
        other[same] = rng.integers(0, k, int(same.sum()))
        same = flip & (other == labels)
    out[flip] = other[flip]
    return out


@pytest.mark.parametrize(("p", "k"), [(0.1, 2), (0.3, 3), (0.2, 5), (0.45, 10), (0.6, 4)])
def test_pair_flip_rates_match_monte_carlo(p, k):
    rng = np.random.default_rng(17)
    a = rng.integers(0, k, PAIRS)
    b = (a + rng.integers(1, k, PAIRS)) % k  # a different true class
    same_pair_differs = _flip(rng, a, p, k) != _flip(rng, a, p, k)
    diff_pair_agrees = _flip(rng, a, p, k) == _flip(rng, b, p, k)
    q_pos, q_neg = pair_flip_rates(p, k)
    # tolerance: 5 binomial standard errors (≤ 0.004 for 400k pairs)
    assert abs(same_pair_differs.mean() - q_pos) < 5 * math.sqrt(q_pos * (1 - q_pos) / PAIRS) + 1e-12
    assert abs(diff_pair_agrees.mean() - q_neg) < 5 * math.sqrt(q_neg * (1 - q_neg) / PAIRS) + 1e-12


def test_pair_flip_rates_hand_values():
    assert pair_flip_rates(0.0, 7) == (0.0, 0.0)
    # K = 2: a pair's agreement changes iff exactly one label flips, so q₊ = q₋ = 2p(1−p)
    q_pos, q_neg = pair_flip_rates(0.3, 2)
    assert q_pos == pytest.approx(0.42) and q_neg == pytest.approx(0.42)
    # K = 3, p = 0.5: q₊ = 1 − 0.25 − 0.125; q₋ = (2·0.5·2 − 3·0.25)/4
    assert pair_flip_rates(0.5, 3) == pytest.approx((0.625, 0.3125))


@pytest.mark.parametrize(("p", "k"), [(-0.1, 3), (1.0, 3), (float("nan"), 3), (0.1, 1)])
def test_pair_flip_rates_refuse_bad_arguments(p, k):
    with pytest.raises(ValueError):
        pair_flip_rates(p, k)


def test_noise_tolerance_condition():
    assert noise_tolerance(0.0, 10)
    assert noise_tolerance(0.3, 2)  # q₊ = q₋ = 0.42
    assert not noise_tolerance(0.3, 2, eta_neg=1.25)  # η₋·q₋ = 0.525
    assert not noise_tolerance(0.3, 2, eta_pos=1.25)
    assert noise_tolerance(0.3, 2, eta_pos=1.19, eta_neg=1.19)  # 0.4998
    assert not noise_tolerance(0.5, 10)  # q₊ = 1 − 0.25 − 0.25/9 ≈ 0.722
    assert effective_flip_rates(0.3, 2, 2.0, 0.5) == pytest.approx((0.84, 0.21))
    with pytest.raises(ValueError):
        noise_tolerance(0.1, 3, eta_neg=-1.0)


def test_skew_is_one_for_uniform_sampling():
    rng = np.random.default_rng(0)
    candidates = rng.integers(1, 50, 1000)
    assert sampler_skew(1.0 / candidates, candidates) == pytest.approx(1.0, abs=1e-12)
    assert sampler_skew(torch.full((10,), 0.25), 4) == pytest.approx(1.0)


def test_skew_above_one_for_a_sampler_preferring_close_negatives():
    """Anchors with random distances to their candidate negatives; the sampler draws negative j with
    q_j ∝ exp(−d_j / 0.1). η from the drawn pairs must match the brute-force expectation
    mean_a n_a Σ_j q_aj² (Monte-Carlo tolerance 3%) and exceed 1."""
    rng = np.random.default_rng(3)
    anchors, draws_per_anchor = 200, 200
    drawn_probs, drawn_counts, expected = [], [], []
    for _ in range(anchors):
        n = int(rng.integers(5, 40))
        d = rng.uniform(0.2, 2.0, n)
        q = np.exp(-d / 0.1)
        q /= q.sum()
        picks = rng.choice(n, size=draws_per_anchor, p=q)
        drawn_probs.extend(q[picks])
        drawn_counts.extend([n] * draws_per_anchor)
        expected.append(n * sum(qj * qj for qj in q))
    eta = sampler_skew(np.array(drawn_probs), np.array(drawn_counts))
    assert eta == pytest.approx(np.mean(expected), rel=0.03)
    assert eta > 2.0


def test_skew_refuses_bad_input():
    with pytest.raises(ValueError):
        sampler_skew([], 3)
    with pytest.raises(ValueError):
        sampler_skew([0.5, 1.5], 2)
    with pytest.raises(ValueError):
        sampler_skew([0.5, 0.5], [2, 2, 2])
    with pytest.raises(ValueError):
        sampler_skew([0.5], 0)
