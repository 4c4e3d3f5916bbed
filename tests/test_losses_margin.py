"""raydist.losses.margin against a brute-force loop over pairs in float64
(docs/algorithms.md#margin-loss: ``[α + t(d − β)]₊``)."""

from __future__ import annotations

import math

import pytest
import torch
from test_losses_triplets import LABEL_SETS, brute_force_mine, distance_table, pair_distance, unit_rows

from raydist.losses.distances import DISTANCES
from raydist.losses.margin import MarginBeta, margin_loss, margin_loss_parts, margin_terms
from raydist.losses.triplets import Triplets, mine_triplets

LABELS = LABEL_SETS["singleton"]  # 4 classes, classes 2 and 3 with a single sample


def brute_force_pair_terms(emb, labels, triplets, *, beta, alpha, distance) -> list[torch.Tensor]:
    """``[α + t(d − β_a)]₊`` for each triplet's pairs (a, p) with t = +1 and (a, n) with t = −1."""
    terms = []
    for a, p, n in triplets:
        b = beta if not isinstance(beta, torch.Tensor) or beta.ndim == 0 else beta[labels[a]]
        for other, t in ((p, 1.0), (n, -1.0)):
            terms.append(torch.clamp(alpha + t * (pair_distance(emb[a], emb[other], distance) - b), min=0.0))
    return terms


def brute_force_margin(emb, labels, triplets, *, beta, alpha, nu, distance, reduction) -> torch.Tensor:
    """Σ of the pair terms plus ν·Σ_triplets β_a; "mean" divides by the number of non-zero pair terms."""
    terms = brute_force_pair_terms(emb, labels, triplets, beta=beta, alpha=alpha, distance=distance)
    total = sum(terms, emb.new_zeros(()))
    for a, _, _ in triplets:
        total = total + nu * (
            beta if not isinstance(beta, torch.Tensor) or beta.ndim == 0 else beta[labels[a]]
        )
    return total / max(sum(int(t > 0) for t in terms), 1) if reduction == "mean" else total


def _triplets(listed: list[tuple[int, int, int]]) -> Triplets:
    return Triplets(*(torch.tensor(c, dtype=torch.long) for c in zip(*listed, strict=False)))


def _beta(kind: str, boundary: float) -> float | torch.Tensor:
    if kind == "float":
        return boundary
    if kind == "global":
        return torch.tensor(boundary, dtype=torch.float64, requires_grad=True)
    return (boundary + 0.1 * torch.arange(4, dtype=torch.float64)).requires_grad_()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("distance", DISTANCES.names())
@pytest.mark.parametrize("beta_kind", ["float", "global", "per-class"])
def test_margin_loss_matches_brute_force(beta_kind: str, distance: str, reduction: str) -> None:
    emb = unit_rows(len(LABELS), seed=11).requires_grad_()
    listed = sorted(brute_force_mine(distance_table(emb.detach(), distance), LABELS, "all", 0.0))
    beta = _beta(beta_kind, 1.2 if distance == "euclidean" else 0.7)
    kwargs = {"beta": beta, "alpha": 0.2, "distance": distance}
    got = margin_loss(
        emb, torch.tensor(LABELS), triplets=_triplets(listed), nu=0.05, reduction=reduction, **kwargs
    )
    want = brute_force_margin(emb, LABELS, listed, nu=0.05, reduction=reduction, **kwargs)
    with torch.no_grad():  # zero and non-zero pair terms both occur, so "mean" is not Σ / 2T
        nonzero = sum(int(t > 0) for t in brute_force_pair_terms(emb, LABELS, listed, **kwargs))
    assert 0 < nonzero < 2 * len(listed)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    inputs = [emb] if beta_kind == "float" else [emb, beta]
    grads = torch.autograd.grad(got, inputs)
    want_grads = torch.autograd.grad(want, inputs)
    for g, w in zip(grads, want_grads, strict=False):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    if beta_kind == "per-class":  # classes 2 and 3 are never anchors: their β gets no gradient
        assert grads[1][2] == 0 and grads[1][3] == 0 and grads[1][0] != 0


def test_mean_divides_by_nonzero_pairs() -> None:
    """Hand-made: rows on the unit circle at chord distances 0.5, 1.0, 1.3, 1.6 from row 0; with α = 0.2,
    β = 1.2 the pair terms of (0, 1, 2) and (0, 3, 4) are [0, 0.3] (positives), [0.4, 0] (negatives)."""
    angles = [0.0] + [2 * math.asin(d / 2) for d in (0.5, 1.0, 1.3, 1.6)]
    emb = torch.tensor([[math.cos(t), math.sin(t)] for t in angles], dtype=torch.float64)
    triplets = _triplets([(0, 1, 2), (0, 3, 4)])
    terms = margin_terms(emb, triplets, beta=1.2, alpha=0.2)
    torch.testing.assert_close(terms, torch.tensor([0.0, 0.3, 0.4, 0.0], dtype=torch.float64))
    labels = torch.tensor([0, 0, 1, 0, 1])
    loss = margin_loss(emb, labels, triplets=triplets)
    assert loss.item() == pytest.approx(0.7 / 2, rel=1e-12)  # not 0.7 / 4
    assert margin_loss(emb, labels, triplets=triplets, reduction="sum").item() == pytest.approx(
        0.7, rel=1e-12
    )
    regularised = margin_loss(emb, labels, triplets=triplets, nu=0.1)
    assert regularised.item() == pytest.approx((0.7 + 0.1 * 2 * 1.2) / 2, rel=1e-12)


def test_mining_inside_margin_loss() -> None:
    """Without triplets the loss mines with ``strategy`` (semi-hard windows use α) and ``generator``."""
    emb = unit_rows(len(LABELS), seed=12).requires_grad_()
    labels = torch.tensor(LABELS)
    got = margin_loss(emb, labels, strategy="hardest")
    listed = sorted(brute_force_mine(distance_table(emb.detach(), "euclidean"), LABELS, "hardest", 0.2))
    want = brute_force_margin(
        emb, LABELS, listed, beta=1.2, alpha=0.2, nu=0.0, distance="euclidean", reduction="mean"
    )
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    drawn = mine_triplets(
        emb, labels, strategy="distance-weighted", generator=torch.Generator().manual_seed(3)
    )
    listed = list(zip(*(t.tolist() for t in drawn), strict=False))
    got = margin_loss(emb, labels, generator=torch.Generator().manual_seed(3))  # default: distance-weighted
    want = brute_force_margin(
        emb, LABELS, listed, beta=1.2, alpha=0.2, nu=0.0, distance="euclidean", reduction="mean"
    )
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("labels", [[1] * 5, [0, 1, 2, 3, 4]], ids=["one-class", "all-distinct"])
def test_no_triplet_gives_connected_zero(labels: list[int], reduction: str) -> None:
    emb = unit_rows(5, seed=13).requires_grad_()
    module = MarginBeta(num_classes=5, dtype=torch.float64)
    loss = margin_loss(
        emb,
        torch.tensor(labels),
        beta=module.beta,
        nu=0.1,
        reduction=reduction,
        generator=torch.Generator().manual_seed(0),
    )
    loss.backward()
    assert loss.item() == 0.0
    assert emb.grad.abs().max() == 0 and module.beta.grad.abs().max() == 0


def test_margin_beta_module() -> None:
    labels = torch.tensor([2, 0, 2, 1])
    one = MarginBeta(dtype=torch.float64)
    assert one.beta.shape == () and one.beta.item() == 1.2 and one.beta.requires_grad
    assert one(labels).tolist() == [1.2] * 4
    per_class = MarginBeta(num_classes=3, init=1.0)
    with torch.no_grad():
        per_class.beta.copy_(torch.tensor([1.0, 1.1, 1.3]))
    torch.testing.assert_close(per_class(labels), torch.tensor([1.3, 1.0, 1.3, 1.1]))
    per_class(labels).sum().backward()
    assert per_class.beta.grad.tolist() == [1.0, 1.0, 2.0]
    # the module's parameter is what margin_loss takes as a learnable β
    emb = unit_rows(len(LABELS), seed=14)
    parts = margin_loss_parts(emb, torch.tensor(LABELS), _triplets([(0, 1, 2)]), beta=per_class.beta, nu=1.0)
    assert parts.total.requires_grad


def test_bad_input_raises() -> None:
    emb = unit_rows(4)
    triplets = _triplets([(0, 2, 1)])
    with pytest.raises(ValueError, match="per-class"):
        margin_loss(emb, torch.tensor([0, 1, 0, 1]), triplets=triplets, beta=torch.ones(2, 2))
    with pytest.raises(ValueError, match="mean"):
        margin_loss(emb, torch.tensor([0, 1, 0, 1]), triplets=triplets, reduction="mean_nonzero")
    with pytest.raises(ValueError, match="1-D integer tensor"):
        margin_loss(emb, torch.tensor([0.0, 1, 0, 1]), triplets=triplets)
