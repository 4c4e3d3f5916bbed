"""Stratified sampler: allocation rules, unbiasedness by exact enumeration of every possible batch (B not
divisible by the number of strata), exact variance of the estimator vs the clustering objective, and the
sampler's own draws against those distributions (Monte-Carlo, tolerance 5 standard errors).

Variance of ĝ = Σ_k (N_k/N)(1/b_k) Σ_{j≤b_k} g_{k,j} with g_{k,j} drawn uniformly with replacement from
stratum k (independent draws): Var ĝ = Σ_k (N_k/N)² V_k / b_k with V_k = (1/N_k) Σ_{i∈k} ‖g_i − μ_k‖².
* Equal draws b_k = b (the GC paper's sampler): Var = (1/(b N²)) Σ_k N_k Σ_{i∈k} ‖g_i − μ_k‖², i.e. the
  GC objective Σ_k N_k Σ_{i∈k} ‖C_k − g_i‖² at C_k = μ_k, over b N².
* Proportional draws b_k = B N_k/N: Var = (1/(N B)) Σ_k Σ_{i∈k} ‖g_i − μ_k‖² (the k-means distortion).
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch

from raydist.gradclust import StratifiedSampler, allocate, stratified_weights


@pytest.mark.parametrize(
    ("sizes", "batch", "allocation", "want"),
    [
        ([5, 3, 1, 0], 4, "proportional", [2, 1, 1, 0]),
        ([3, 2, 2], 4, "proportional", [2, 1, 1]),
        ([10, 1, 1], 3, "proportional", [1, 1, 1]),  # the floor of 1 over-allocates; taken back from k=0
        ([6, 6, 6], 4, "proportional", [2, 1, 1]),  # equal remainders: lowest k first
        ([6, 3, 3], 8, "proportional", [4, 2, 2]),  # integral quotas are exact
        ([5, 3, 1, 0], 7, "equal", [3, 2, 2, 0]),
        ([1, 3, 3], 5, "equal", [1, 2, 2]),  # ties by size, then lowest k
    ],
)
def test_allocation_examples(sizes: list[int], batch: int, allocation: str, want: list[int]) -> None:
    assert allocate(torch.tensor(sizes), batch, allocation).tolist() == want


def test_allocation_properties() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        sizes = rng.integers(0, 30, size=rng.integers(1, 8))
        sizes[rng.integers(len(sizes))] += 1
        nonempty = int((sizes > 0).sum())
        batch = int(rng.integers(nonempty, sizes.sum() + 1))
        draws = allocate(torch.tensor(sizes), batch).numpy()
        quotas = batch * sizes / sizes.sum()
        assert draws.sum() == batch and (draws[sizes == 0] == 0).all() and (draws[sizes > 0] >= 1).all()
        assert (draws <= sizes).all()
        if (quotas[sizes > 0] >= 1).all():
            assert (np.abs(draws - quotas) < 1).all()
    with pytest.raises(ValueError, match="non-empty"):
        allocate(torch.tensor([1, 1, 1]), 2)
    with pytest.raises(ValueError, match="allocation"):
        allocate(torch.tensor([1, 1]), 2, "neyman")


STRATA = torch.tensor([-1, -1, -1, 4, 4, 9, 9])  # N = 7 in 3 strata of sizes 3, 2, 2 (−1: unassigned)
LOSSES = torch.randn(7, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # vectors ℓ_i


def _expected_weight(label: int, draws: dict[int, int], batch: int) -> float:
    size = int((label == STRATA).sum())
    return size / (STRATA.shape[0] * draws[label]) * batch


def _enumerate(draws: dict[int, int], replacement: bool) -> list[tuple[int, ...]]:
    """Every equally likely batch: ordered tuples (with replacement) or subsets (without) per stratum."""
    pools = []
    for label, b in draws.items():
        members = (label == STRATA).nonzero().squeeze(1).tolist()
        pick = itertools.product(members, repeat=b) if replacement else itertools.combinations(members, b)
        pools.append(list(pick))
    return [sum(parts, ()) for parts in itertools.product(*pools)]


def _estimate(rows: tuple[int, ...], draws: dict[int, int], batch: int) -> torch.Tensor:
    w = torch.tensor([_expected_weight(int(STRATA[r]), draws, batch) for r in rows], dtype=torch.float64)
    return (w.unsqueeze(1) * LOSSES[list(rows)]).sum(0) / batch


@pytest.mark.parametrize("replacement", [False, True])
def test_stratified_estimator_is_unbiased(replacement: bool) -> None:
    batch = 4  # not divisible by the 3 strata: draws 2, 1, 1
    sampler = StratifiedSampler(STRATA, batch, replacement=replacement, dtype=torch.float64)
    draws = dict(zip(sampler.labels.tolist(), sampler.draws.tolist(), strict=False))
    assert draws == {-1: 2, 4: 1, 9: 1}
    support = _enumerate(draws, replacement)
    exact = torch.stack([_estimate(rows, draws, batch) for rows in support]).mean(0)
    torch.testing.assert_close(exact, LOSSES.mean(0), rtol=1e-12, atol=1e-14)
    # the sampler's weights are the formula's, and its batches are uniform over the enumerated support
    draws_made, generator = 12_000, torch.Generator().manual_seed(1)
    batches = [sampler.sample(generator) for _ in range(draws_made)]
    rows = torch.stack([b.indices for b in batches])
    row_weight = torch.tensor([_expected_weight(int(k), draws, batch) for k in STRATA], dtype=torch.float64)
    torch.testing.assert_close(
        torch.stack([b.weights for b in batches]), row_weight[rows], rtol=1e-15, atol=0
    )
    if not replacement:
        rows[:, :2] = rows[:, :2].sort(1).values  # the stratum of size 3 gives an unordered pair
    seen = Counter(map(tuple, rows.tolist()))
    keys = set(support)
    assert set(seen) <= keys
    p = 1 / len(keys)
    tolerance = 5 * (p * (1 - p) / draws_made) ** 0.5
    assert max(abs(seen[k] / draws_made - p) for k in keys) < tolerance


def _within(labels: torch.Tensor, values: torch.Tensor) -> tuple[float, float]:
    """(Σ_k N_k Σ_{i∈k}‖g_i − μ_k‖², Σ_k Σ_{i∈k}‖g_i − μ_k‖²)."""
    objective = distortion = 0.0
    for label in labels.unique():
        members = values[labels == label]
        sse = float((members - members.mean(0)).square().sum())
        objective, distortion = objective + members.shape[0] * sse, distortion + sse
    return objective, distortion


def _exact_variance(support: list, draws: dict, batch: int) -> tuple[float, float]:
    """(E‖ĝ − μ‖², sd of ‖ĝ − μ‖²) over the equally likely batches."""
    errors = torch.stack(
        [(_estimate(rows, draws, batch) - LOSSES.mean(0)).square().sum() for rows in support]
    )
    return float(errors.mean()), float(errors.std(correction=0))


def test_variance_equal_draws_is_objective_over_b_n2() -> None:
    batch, b, n = 6, 2, STRATA.shape[0]
    sampler = StratifiedSampler(STRATA, batch, allocation="equal", replacement=True, dtype=torch.float64)
    draws = dict(zip(sampler.labels.tolist(), sampler.draws.tolist(), strict=False))
    assert set(draws.values()) == {b}
    support = _enumerate(draws, replacement=True)
    variance, spread = _exact_variance(support, draws, batch)
    objective, _ = _within(STRATA, LOSSES)
    assert variance == pytest.approx(objective / (b * n**2), rel=1e-12)
    # the sampler's own draws: Monte-Carlo mean of ‖ĝ − μ‖² within 5 standard errors
    draws_made, generator = 20_000, torch.Generator().manual_seed(2)
    batches = [sampler.sample(generator) for _ in range(draws_made)]
    rows, weights = torch.stack([s.indices for s in batches]), torch.stack([s.weights for s in batches])
    estimates = (weights.unsqueeze(2) * LOSSES[rows]).sum(1) / batch
    errors = (estimates - LOSSES.mean(0)).square().sum(1)
    assert abs(float(errors.mean()) - variance) < 5 * spread / draws_made**0.5


def test_variance_proportional_draws_is_distortion_over_nb() -> None:
    strata = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    values = torch.randn(8, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    batch = 4  # draws B·N_k/N = 2, 1, 1
    draws = allocate(torch.tensor([4, 2, 2]), batch).tolist()
    assert draws == [2, 1, 1]
    estimates = []
    pools = [
        itertools.product((strata == k).nonzero().squeeze(1).tolist(), repeat=b) for k, b in enumerate(draws)
    ]
    for parts in itertools.product(*pools):
        rows = torch.tensor(sum(parts, ()))
        w = stratified_weights(strata[rows], torch.tensor([4, 2, 2]), torch.tensor(draws), batch)
        estimates.append((w.unsqueeze(1) * values[rows]).sum(0) / batch)
    estimates = torch.stack(estimates)
    torch.testing.assert_close(estimates.mean(0), values.mean(0), rtol=1e-12, atol=1e-14)
    variance = float((estimates - values.mean(0)).square().sum(1).mean())
    objective, distortion = _within(strata, values)
    assert variance == pytest.approx(distortion / (8 * batch), rel=1e-12)
    assert variance != pytest.approx(objective / (2 * 8**2), rel=1e-3)  # the N_k-weighted form needs equal b


def test_batches_cover_every_stratum_and_are_deterministic() -> None:
    strata = torch.tensor([3, 1, 1, 2, 2, 2, 2, 2, 2, 0, 0, 3])
    sampler = StratifiedSampler(strata, 7, seed=4, num_batches=5)
    epoch0 = list(sampler)
    for b in epoch0:
        counts = torch.bincount(strata[b.indices], minlength=4)
        assert counts.tolist() == sampler.draws.tolist() and len(set(b.indices.tolist())) == 7
    assert all(
        torch.equal(a.indices, b.indices)
        for a, b in zip(epoch0, StratifiedSampler(strata, 7, seed=4), strict=False)
    )
    sampler.set_epoch(1)
    assert any(not torch.equal(a.indices, b.indices) for a, b in zip(epoch0, sampler, strict=False))
    other = StratifiedSampler(strata, 7, seed=5, num_batches=5)
    assert any(not torch.equal(a.indices, b.indices) for a, b in zip(epoch0, other, strict=False))
    assert len(sampler) == 5 and len(StratifiedSampler(strata, 5)) == 2


def test_small_stratum_is_drawn_with_replacement_and_small_batches_fall_back_to_uniform() -> None:
    strata = torch.tensor([0, 1, 1, 1, 1, 1])
    b = StratifiedSampler(strata, 4, allocation="equal").sample(torch.Generator().manual_seed(0))
    assert b.indices[:2].tolist() == [0, 0]  # b_0 = 2 > N_0 = 1: independent uniform draws
    uniform = StratifiedSampler(torch.arange(5), 3)  # 5 strata, B = 3: cannot stratify
    assert not uniform.stratified
    generator, hits = torch.Generator().manual_seed(1), torch.zeros(5)
    for _ in range(5000):
        s = uniform.sample(generator)
        assert len(set(s.indices.tolist())) == 3 and s.weights.tolist() == [1.0, 1.0, 1.0]
        hits[s.indices] += 1
    p = 3 / 5  # inclusion probability of each row
    assert (hits / 5000 - p).abs().max() < 5 * (p * (1 - p) / 5000) ** 0.5
