"""raydist.losses.triplets / distances against brute-force python enumeration in float64
(docs/algorithms.md#triplet-miners).

Miners are compared as sets of triplets with loops over their written definitions; random miners by the
validity of every draw and by draw frequencies over many seeds against probabilities computed here.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from raydist.losses.distances import DISTANCES, paired_distance, pairwise_distance
from raydist.losses.miners import MINERS
from raydist.losses.miners.distance_weighted import distance_weights
from raydist.losses.triplets import mine_triplets, negative_probabilities, triplet_loss

MINER_STRATEGIES = MINERS.names()
RANDOM_STRATEGIES = [s for s in MINER_STRATEGIES if MINERS.get(s).random]
DETERMINISTIC = [s for s in MINER_STRATEGIES if s not in RANDOM_STRATEGIES]
LABEL_SETS = {
    "balanced": [0, 1, 2, 0, 1, 2, 0, 1, 2, 0],
    "singleton": [0, 0, 1, 1, 1, 2, 0, 3, 1, 0],  # classes 2 and 3 have one sample each
}


def unit_rows(n: int, d: int = 4, seed: int = 0) -> torch.Tensor:
    """n random float64 rows of norm 1."""
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x / x.norm(dim=1, keepdim=True)


def pair_distance(x: torch.Tensor, y: torch.Tensor, distance: str) -> torch.Tensor:
    """d(x, y) for two rows, written out per coordinate (differentiable)."""
    if distance == "cosine":
        return 1 - sum(x[k] * y[k] for k in range(x.shape[0]))
    return torch.sqrt(sum((x[k] - y[k]) ** 2 for k in range(x.shape[0])))


def distance_table(emb: torch.Tensor, distance: str) -> list[list[float]]:
    rows = emb.tolist()
    if distance == "cosine":
        return [[1 - sum(a * b for a, b in zip(u, v, strict=False)) for v in rows] for u in rows]
    return [[math.sqrt(sum((a - b) ** 2 for a, b in zip(u, v, strict=False))) for v in rows] for u in rows]


def positive_pairs(labels: list[int]) -> list[tuple[int, int]]:
    n = len(labels)
    return [(a, p) for a in range(n) for p in range(n) if a != p and labels[a] == labels[p]]


def negatives_of(labels: list[int], a: int) -> list[int]:
    return [n for n in range(len(labels)) if labels[n] != labels[a]]


def brute_force_mine(table: list[list[float]], labels: list[int], strategy: str, margin: float) -> set:
    """The deterministic strategies, straight from their definitions (ties: lowest index)."""
    out = set()
    if strategy == "hardest":
        for a in range(len(labels)):
            pos = [p for p in range(len(labels)) if p != a and labels[p] == labels[a]]
            neg = negatives_of(labels, a)
            if pos and neg:
                p = max(pos, key=lambda j: (table[a][j], -j))
                n = min(neg, key=lambda j: (table[a][j], j))
                out.add((a, p, n))
        return out
    for a, p in positive_pairs(labels):
        d_ap = table[a][p]
        negs = negatives_of(labels, a)
        if strategy == "all":
            out |= {(a, p, n) for n in negs}
        elif strategy == "semihard-all":
            out |= {(a, p, n) for n in negs if d_ap < table[a][n] < d_ap + margin}
        elif strategy == "semihard-fixed":
            farther = [n for n in negs if table[a][n] > d_ap]
            if farther:
                out.add((a, p, min(farther, key=lambda j: (table[a][j], j))))
    return out


def brute_force_weight(d: float, dim: int, cutoff: float, max_weight: float) -> float:
    """min(λ, 1/q(max(d, cutoff))) with the sphere chord density q written with math.gamma."""
    d = max(d, cutoff)
    if d >= 2:
        return max_weight
    norm = 2 ** (dim - 2) * math.gamma((dim - 1) / 2) ** 2 / math.gamma(dim - 1)
    q = d ** (dim - 2) * (1 - d * d / 4) ** ((dim - 3) / 2) / norm
    return min(max_weight, 1 / q)


def draw_probabilities(emb, labels, strategy, margin, distance, cutoff=0.5, max_weight=10.0) -> dict:
    """{(a, p): {n: P(n | a, p)}} for the random strategies, from their definitions."""
    table = distance_table(emb, distance)
    chord = distance_table(emb, "euclidean")
    out = {}
    for a, p in positive_pairs(labels):
        negs = negatives_of(labels, a)
        if strategy == "semihard-random":
            weights = {n: 1.0 for n in negs if table[a][p] < table[a][n] < table[a][p] + margin}
        elif strategy == "one-to-one":
            weights = {n: 1.0 for n in negs}
        else:
            weights = {n: brute_force_weight(chord[a][n], emb.shape[1], cutoff, max_weight) for n in negs}
        total = sum(weights.values())
        if total > 0:
            out[(a, p)] = {n: w / total for n, w in weights.items()}
    return out


def as_list(triplets) -> list:
    return list(zip(*(t.tolist() for t in triplets), strict=False))


@pytest.mark.parametrize("distance", DISTANCES.names())
def test_distances_match_brute_force_and_identical_rows_have_zero_gradient(distance: str) -> None:
    x, y = unit_rows(5, seed=1), unit_rows(3, seed=2)
    want = torch.tensor(distance_table(torch.cat([x, y]), distance), dtype=torch.float64)[:5, 5:]
    torch.testing.assert_close(pairwise_distance(x, y, distance), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(paired_distance(x[:3], y, distance), want.diagonal(), rtol=1e-12, atol=1e-12)
    a = unit_rows(2, seed=3).requires_grad_()
    b = a.detach().clone().requires_grad_()
    (pairwise_distance(a, b, distance).sum() + paired_distance(a, b, distance).sum()).backward()
    assert torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()
    if distance == "euclidean":  # identical rows: distance ~1e-6 and no gradient through the clamp
        assert pairwise_distance(a, b).diagonal().max() < 1e-5
        same = a.detach().requires_grad_()
        paired_distance(same, same.detach()).sum().backward()
        assert same.grad.abs().max() == 0
    with pytest.raises(ValueError, match="euclidean"):
        pairwise_distance(x, y, "manhattan")


def test_distance_weights_are_inverse_sphere_density() -> None:
    """1/w with no cutoff and no cap integrates to 1 over [0, 2] and matches the gamma-function formula."""
    for dim in (2, 3, 4, 8, 32):
        grid = (torch.arange(200_000, dtype=torch.float64) + 0.5) * (2 / 200_000)
        density = 1 / distance_weights(grid, dim, cutoff=0.0, max_weight=math.inf)
        assert float(density.sum() * (2 / 200_000)) == pytest.approx(1.0, abs=2e-3)
        points = torch.tensor([0.1, 0.7, 1.3, 1.9], dtype=torch.float64)
        got = distance_weights(points, dim, cutoff=0.5, max_weight=50.0)
        want = [brute_force_weight(d, dim, 0.5, 50.0) for d in points.tolist()]
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=0)
    assert distance_weights(torch.tensor([2.0, 2.0 + 1e-9]), 4).tolist() == [10.0, 10.0]  # λ at d ≥ 2
    with pytest.raises(ValueError, match="dim"):
        distance_weights(torch.tensor([1.0]), 1)


@pytest.mark.parametrize("distance", DISTANCES.names())
@pytest.mark.parametrize("labels", list(LABEL_SETS.values()), ids=list(LABEL_SETS))
@pytest.mark.parametrize("strategy", DETERMINISTIC)
def test_deterministic_miners_match_enumeration(strategy: str, labels: list[int], distance: str) -> None:
    margin = 0.4 if distance == "euclidean" else 0.2
    for seed in range(3):
        emb = unit_rows(len(labels), seed=seed)
        got = mine_triplets(emb, torch.tensor(labels), strategy=strategy, margin=margin, distance=distance)
        want = brute_force_mine(distance_table(emb, distance), labels, strategy, margin)
        assert all(t.dtype == torch.long for t in got)
        assert as_list(got) == sorted(want)  # the same set, in lexicographic order
        assert want or strategy == "semihard-all"
        probs = negative_probabilities(emb, torch.tensor(labels), *got, strategy=strategy, margin=margin)
        assert probs.tolist() == [1.0] * len(want)


@pytest.mark.parametrize("distance", DISTANCES.names())
@pytest.mark.parametrize("strategy", RANDOM_STRATEGIES)
def test_random_miners_draw_valid_triplets_one_per_pair(strategy: str, distance: str) -> None:
    labels = LABEL_SETS["singleton"]
    margin = 0.5
    for seed in range(3):
        emb = unit_rows(len(labels), seed=seed)
        got = mine_triplets(
            emb,
            torch.tensor(labels),
            strategy=strategy,
            margin=margin,
            distance=distance,
            generator=torch.Generator().manual_seed(seed),
        )
        want = draw_probabilities(emb, labels, strategy, margin, distance)
        triplets = as_list(got)
        assert triplets == sorted(triplets)
        assert [(a, p) for a, p, _ in triplets] == sorted(want)  # exactly one draw per pair with candidates
        assert all(want[(a, p)].get(n, 0) > 0 for a, p, n in triplets)  # each draw is a candidate
        again = mine_triplets(
            emb,
            torch.tensor(labels),
            strategy=strategy,
            margin=margin,
            distance=distance,
            generator=torch.Generator().manual_seed(seed),
        )
        assert as_list(again) == triplets


@pytest.mark.parametrize("strategy", RANDOM_STRATEGIES)
def test_random_miner_frequencies_match_probabilities(strategy: str) -> None:
    """Over 2000 seeds each pair's draw frequency of n is within 5 binomial standard deviations (+0.005) of
    P(n | a, p) from the definition; :func:`negative_probabilities` gives the same P to 1e-12."""
    labels = [0, 0, 1, 1, 2, 0, 2, 3]
    emb = unit_rows(len(labels), d=4, seed=7)
    emb[2] = emb[0] + 0.05 * emb[1]  # a close negative of anchor 0 (clipped at the 0.5 cutoff and capped)
    emb[2] /= emb[2].norm()
    margin, max_weight, draws = 0.8, 2.0, 2000
    want = draw_probabilities(emb, labels, strategy, margin, "euclidean", max_weight=max_weight)
    if strategy == "distance-weighted":  # both sides of the cap λ occur
        weights = [w for probs in want.values() for w in probs.values()]
        assert max(weights) > 1.5 * min(weights)
    counts: Counter = Counter()
    for seed in range(draws):
        got = mine_triplets(
            emb,
            torch.tensor(labels),
            strategy=strategy,
            margin=margin,
            max_weight=max_weight,
            generator=torch.Generator().manual_seed(seed),
        )
        counts.update(as_list(got))
    for (a, p), probs in want.items():
        assert sum(counts[(a, p, n)] for n in range(len(labels))) == draws
        for n, prob in probs.items():
            tolerance = 5 * math.sqrt(prob * (1 - prob) / draws) + 0.005
            assert abs(counts[(a, p, n)] / draws - prob) <= tolerance, (a, p, n)
    anchors, positives, negatives = (
        torch.tensor(c) for c in zip(*[(a, p, n) for a, p, n in counts], strict=False)
    )
    got = negative_probabilities(
        emb,
        torch.tensor(labels),
        anchors,
        positives,
        negatives,
        strategy=strategy,
        margin=margin,
        max_weight=max_weight,
    )
    expected = [
        want[(a, p)][n]
        for a, p, n in zip(anchors.tolist(), positives.tolist(), negatives.tolist(), strict=False)
    ]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)


@pytest.mark.parametrize("strategy", MINER_STRATEGIES)
def test_class_with_one_sample_is_never_anchor_or_positive(strategy: str) -> None:
    labels = [0, 0, 0, 1, 1, 2]  # row 5 is alone in class 2
    emb = unit_rows(6, seed=4).requires_grad_()
    g = torch.Generator().manual_seed(0)
    got = mine_triplets(emb, torch.tensor(labels), strategy=strategy, margin=2.0, generator=g)
    assert len(got.anchors) > 0
    assert 5 not in got.anchors.tolist() + got.positives.tolist()
    loss = triplet_loss(emb, got, margin=2.0)
    loss.backward()
    assert torch.isfinite(loss) and loss > 0 and torch.isfinite(emb.grad).all()


@pytest.mark.parametrize("labels", [[1] * 5, [0, 1, 2, 3, 4]], ids=["one-class", "all-distinct"])
@pytest.mark.parametrize("strategy", MINER_STRATEGIES)
def test_no_valid_triplet_gives_connected_zero(strategy: str, labels: list[int]) -> None:
    emb = unit_rows(5, seed=5).requires_grad_()
    g = torch.Generator().manual_seed(0)
    got = mine_triplets(emb, torch.tensor(labels), strategy=strategy, generator=g)
    assert len(got.anchors) == 0
    for reduction in ("mean", "sum", "mean_nonzero"):
        emb.grad = None
        loss = triplet_loss(emb, got, reduction=reduction)
        loss.backward()
        assert loss.item() == 0.0 and torch.isfinite(loss)
        assert emb.grad is not None and emb.grad.abs().max() == 0


def brute_force_triplet_loss(emb, triplets, *, margin, hinged, distance, reduction) -> torch.Tensor:
    terms = []
    for a, p, n in triplets:
        gap = pair_distance(emb[a], emb[p], distance) - pair_distance(emb[a], emb[n], distance)
        terms.append(torch.clamp(gap + margin, min=0.0) if hinged else gap)
    if reduction == "sum":
        return sum(terms)
    if reduction == "mean":
        return sum(terms) / len(terms)
    positive = [t for t in terms if t > 0]
    return sum(positive) / len(positive)


@pytest.mark.parametrize("reduction", ["mean", "sum", "mean_nonzero"])
@pytest.mark.parametrize("distance", DISTANCES.names())
@pytest.mark.parametrize("hinged", [True, False], ids=["hinged", "unhinged"])
def test_triplet_loss_matches_brute_force(hinged: bool, distance: str, reduction: str) -> None:
    labels = LABEL_SETS["singleton"]
    emb = unit_rows(len(labels), seed=6).requires_grad_()
    triplets = mine_triplets(emb, torch.tensor(labels), strategy="all")
    margin = 0.3
    got = triplet_loss(emb, triplets, margin=margin, hinged=hinged, distance=distance, reduction=reduction)
    listed = as_list(triplets)
    want = brute_force_triplet_loss(
        emb, listed, margin=margin, hinged=hinged, distance=distance, reduction=reduction
    )
    with torch.no_grad():
        terms = [
            brute_force_triplet_loss(
                emb, [t], margin=margin, hinged=hinged, distance=distance, reduction="sum"
            )
            for t in listed
        ]
    assert 0 < sum(t > 0 for t in terms) < len(terms)  # the batch has zero and non-zero hinges
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    (grad,) = torch.autograd.grad(got, emb)
    (want_grad,) = torch.autograd.grad(want, emb)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)


def test_bad_input_raises() -> None:
    emb = unit_rows(4)
    for labels in (
        torch.tensor([0.0, 1, 0, 1]),
        torch.tensor([[0, 1, 0, 1]]),
        torch.tensor([0, 1, 0]),
        torch.tensor([True, False, True, False]),
        [0, 1, 0, 1],
    ):
        with pytest.raises(ValueError, match="1-D integer tensor of length 4"):
            mine_triplets(emb, labels, strategy="all")
    with pytest.raises(ValueError, match="semihard-random"):
        mine_triplets(emb, torch.tensor([0, 1, 0, 1]), strategy="semi-hard")
    with pytest.raises(ValueError, match="2-D"):
        mine_triplets(emb[0], torch.tensor([0]), strategy="all")
    triplets = mine_triplets(emb, torch.tensor([0, 1, 0, 1]), strategy="all")
    with pytest.raises(ValueError, match="mean_nonzero"):
        triplet_loss(emb, triplets, reduction="max")


@pytest.mark.parametrize("distance", DISTANCES.names())
@pytest.mark.parametrize("strategy", MINER_STRATEGIES)
def test_duplicate_rows_in_float32_stay_finite(strategy: str, distance: str) -> None:
    """Identical anchor/positive rows (d = 0) and an identical negative: finite loss and gradients."""
    base = unit_rows(4, seed=8).float()
    emb = torch.cat([base, base[:2]]).requires_grad_()  # rows 4, 5 duplicate rows 0, 1
    labels = torch.tensor([0, 1, 0, 1, 0, 0])  # (0, 4) a positive duplicate; 5 duplicates negative 1 of 0
    g = torch.Generator().manual_seed(0)
    triplets = mine_triplets(emb, labels, strategy=strategy, margin=0.5, distance=distance, generator=g)
    assert len(triplets.anchors) > 0
    loss = triplet_loss(emb, triplets, margin=0.5, distance=distance)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(emb.grad).all()


def test_semihard_window_is_strict_at_the_margin_for_both_strategies() -> None:
    """At ``d_an = d_ap + α`` the triplet hinge is 0: neither semi-hard strategy takes that negative. Points on a
    line so the distances are exact: anchor 0 has d_ap = 0.25 and d_an = 0.75 = d_ap + 0.5 (excluded); anchor 1
    has d_ap = 0.25 and d_an = 0.5 (inside)."""
    emb, labels = torch.tensor([[0.0], [0.25], [0.75]], dtype=torch.float64), torch.tensor([0, 0, 1])
    every = mine_triplets(
        emb, labels, strategy="semihard-all", margin=0.5, distance="euclidean", normalize=False
    )
    assert as_list(every) == [(1, 0, 2)]
    drawn = mine_triplets(
        emb,
        labels,
        strategy="semihard-random",
        margin=0.5,
        distance="euclidean",
        generator=torch.Generator().manual_seed(0),
        normalize=False,
    )
    assert as_list(drawn) == [(1, 0, 2)]


def scaled_rows(unit: torch.Tensor, seed: int) -> torch.Tensor:
    """``unit`` with each row multiplied by its own factor in [0.2, 5]."""
    g = torch.Generator().manual_seed(seed)
    return unit * (0.2 + 4.8 * torch.rand(unit.shape[0], 1, generator=g, dtype=unit.dtype))


@pytest.mark.parametrize("distance", DISTANCES.names())
@pytest.mark.parametrize("strategy", DETERMINISTIC)
@pytest.mark.parametrize("labels", LABEL_SETS.values(), ids=LABEL_SETS.keys())
def test_raw_rows_are_mined_as_their_normalised_rows(strategy: str, labels: list[int], distance: str) -> None:
    """By default the miner normalises: scaled rows give the brute-force triplets of the unit rows."""
    unit = unit_rows(len(labels), seed=11)
    raw = scaled_rows(unit, seed=12)
    got = mine_triplets(raw, torch.tensor(labels), strategy=strategy, margin=0.4, distance=distance)
    assert set(as_list(got)) == brute_force_mine(distance_table(unit, distance), labels, strategy, 0.4)


def test_raw_rows_give_the_normalised_draw_probabilities() -> None:
    """``negative_probabilities`` normalises as the miner does (distance-weighted: chord of the unit rows)."""
    labels = LABEL_SETS["balanced"]
    unit = unit_rows(len(labels), seed=13)
    want = draw_probabilities(unit, labels, "distance-weighted", 0.2, "euclidean")
    (a, p), n = next(iter(want)), 1
    got = negative_probabilities(
        scaled_rows(unit, seed=14),
        torch.tensor(labels),
        torch.tensor([a]),
        torch.tensor([p]),
        torch.tensor([n]),
        strategy="distance-weighted",
    )
    assert float(got[0]) == pytest.approx(want[(a, p)][n], rel=1e-12)


def test_normalize_false_mines_the_rows_as_given() -> None:
    """Anchor 0 at angle 0, its positive at 90°; negative 2 at 20° but of norm 5, negative 3 at 120° of norm 1.
    Normalised, 2 is the closest negative; as given, 3 is (|e_0 − e_2| ≈ 4.06 > |e_0 − e_3| ≈ 1.73)."""
    angles, norms = (
        torch.tensor([0.0, 90.0, 20.0, 120.0], dtype=torch.float64).deg2rad(),
        [1.0, 1.0, 5.0, 1.0],
    )
    raw = torch.stack([angles.cos(), angles.sin()], 1) * torch.tensor(norms, dtype=torch.float64).unsqueeze(1)
    labels = [0, 0, 1, 1]
    unit = raw / raw.norm(dim=1, keepdim=True)
    default = mine_triplets(raw, torch.tensor(labels), strategy="hardest")
    as_given = mine_triplets(raw, torch.tensor(labels), strategy="hardest", normalize=False)
    assert set(as_list(default)) == brute_force_mine(
        distance_table(unit, "euclidean"), labels, "hardest", 0.2
    )
    assert set(as_list(as_given)) == brute_force_mine(
        distance_table(raw, "euclidean"), labels, "hardest", 0.2
    )
    assert as_list(default)[0] == (0, 1, 2) and as_list(as_given)[0] == (0, 1, 3)
