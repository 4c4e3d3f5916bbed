"""Triplet miners over a labelled batch and the triplet loss (docs/algorithms.md#triplet-miners; sampling
after Wu et al. 2017).

A miner returns :class:`Triplets` (index tuples, no autograd); :func:`triplet_terms` gives one term per
triplet; :func:`reduce_terms` gives a :class:`TermSum` whose count a cross-worker caller may replace.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from raydist.choices import MINER_STRATEGIES, REDUCTIONS
from raydist.losses.distances import paired_distance, pairwise_distance
from raydist.losses.similarity import l2_normalize

RANDOM_STRATEGIES = ("semihard-random", "one-to-one", "distance-weighted")
TRIPLET_REDUCTIONS = (*REDUCTIONS, "mean_nonzero")

DISTANCE_CUTOFF = 0.5
MAX_WEIGHT = 10.0


class Triplets(NamedTuple):
    """Index tuples (anchor, positive, negative) into one batch: LongTensors of a common length T."""

    anchors: Tensor
    positives: Tensor
    negatives: Tensor


class TermSum(NamedTuple):
    """A loss before its division: ``total`` (sum of the terms the reduction keeps) and ``count`` (how many
    terms it divides by; None for "sum", which never divides)."""

    total: Tensor
    count: Tensor | None

    def value(self, count: Tensor | None = None) -> Tensor:
        """``total / max(count, 1)`` ("sum": ``total``). ``count`` replaces the own count (e.g. by the count
        over all ranks); with nothing counted the total is a graph-connected 0, so the value is 0."""
        if self.count is None:
            return self.total
        return self.total / (self.count if count is None else count).clamp(min=1)


def check_labels(emb: Tensor, labels: Tensor) -> Tensor:
    """``labels`` on ``emb``'s device; ValueError unless emb is [N, D] and labels a 1-D integer tensor [N]."""
    if emb.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D tensor [N, D], got shape {tuple(emb.shape)}")
    if (
        not isinstance(labels, Tensor)
        or labels.ndim != 1
        or labels.shape[0] != emb.shape[0]
        or labels.dtype.is_floating_point
        or labels.dtype.is_complex
        or labels.dtype == torch.bool
    ):
        got = (
            f"dtype={labels.dtype}, shape={tuple(labels.shape)}"
            if isinstance(labels, Tensor)
            else type(labels)
        )
        raise ValueError(
            f"labels must be a 1-D integer tensor of length {emb.shape[0]} (one per row), got {got}"
        )
    return labels.to(emb.device)


def _mining_inputs(emb: Tensor, labels: Tensor, strategy: str, normalize: bool) -> tuple[Tensor, Tensor]:
    """Checked ``(rows, labels)`` of a miner, the rows L2-normalised when ``normalize``."""
    if strategy not in MINER_STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: expected one of {MINER_STRATEGIES}")
    labels = check_labels(emb, labels)
    return (l2_normalize(emb) if normalize else emb), labels


def _label_masks(labels: Tensor) -> tuple[Tensor, Tensor]:
    """``positive[i, j]``: same label and i ≠ j; ``negative[i, j]``: different labels."""
    same = labels.unsqueeze(1) == labels.unsqueeze(0)
    own = torch.eye(labels.shape[0], dtype=torch.bool, device=labels.device)
    return same & ~own, ~same


def distance_weights(
    dist: Tensor, dim: int, *, cutoff: float = DISTANCE_CUTOFF, max_weight: float = MAX_WEIGHT
) -> Tensor:
    """Distance-weighted sampling weight ``w(d) = min(λ, 1 / q(max(d, cutoff)))`` (Wu et al. 2017, §4).

    ``q(d) = d^{n−2} (1 − d²/4)^{(n−3)/2} / (2^{n−2} B((n−1)/2, (n−1)/2))`` is the density on [0, 2] of the
    chord distance between two independent uniform points of the unit sphere in Rⁿ (n = ``dim`` ≥ 2).
    For embeddings spread uniformly, drawing ∝ w makes the drawn distance density ``min(λ·q(d), 1)``:
    distances of density above 1/λ come out evenly, rarer ones in proportion to λ·q. The distance is
    clipped below at ``cutoff`` (0.5, as in the paper) so near-duplicates are not over-weighted, and
    λ = ``max_weight`` bounds the weight of rare distances (incl. d → 2, where q → 0 for n > 3).
    """
    if dim < 2:
        raise ValueError(f"distance-weighted sampling needs embedding dim >= 2, got {dim}")
    half = (dim - 1) / 2
    log_norm = (dim - 2) * math.log(2.0) + 2 * math.lgamma(half) - math.lgamma(2 * half)
    d = dist.clamp(min=cutoff)
    log_q = torch.xlogy(dim - 2.0, d) + torch.xlogy((dim - 3) / 2, (1 - d.pow(2) / 4).clamp(min=0)) - log_norm
    return torch.exp((-log_q).clamp(max=math.log(max_weight)))


def _pair_weights(
    emb: Tensor,
    dist: Tensor,
    negative: Tensor,
    anchors: Tensor,
    positives: Tensor,
    *,
    strategy: str,
    margin: float,
    distance: str,
    cutoff: float,
    max_weight: float,
) -> Tensor:
    """``[M, N]`` weights of each negative n for each pair (anchors[i], positives[i]); 0 = not a candidate."""
    candidates = negative[anchors]
    if strategy in ("semihard-fixed", "semihard-random"):
        d_an, d_ap = dist[anchors], dist[anchors, positives].unsqueeze(1)
        candidates = candidates & (d_an > d_ap)
        if strategy == "semihard-random":
            candidates = candidates & (d_an < d_ap + margin)
    if strategy == "distance-weighted":
        chord = dist if distance == "euclidean" else pairwise_distance(emb, emb, "euclidean")
        weights = distance_weights(chord[anchors], emb.shape[1], cutoff=cutoff, max_weight=max_weight)
        return weights * candidates
    return candidates.to(dist.dtype)


@torch.no_grad()
def mine_triplets(
    emb: Tensor,
    labels: Tensor,
    *,
    strategy: str,
    margin: float = 0.2,
    distance: str = "euclidean",
    generator: torch.Generator | None = None,
    cutoff: float = DISTANCE_CUTOFF,
    max_weight: float = MAX_WEIGHT,
    normalize: bool = True,
) -> Triplets:
    """Triplets of a batch of embeddings ``emb`` [N, D] with integer ``labels`` [N].

    With ``normalize`` (the default) the rows are L2-normalised before any distance, so raw embeddings
    (as pytorch-metric-learning users pass them) and their normalised rows give the same triplets; callers
    whose rows are unit already may pass ``normalize=False``. The losses take their rows as given.

    Positive pair (a, p): ``label[a] = label[p]``, a ≠ p; negative n of a: ``label[n] ≠ label[a]``;
    ``d`` is :func:`pairwise_distance` with ``distance``, α = ``margin``. Strategies:

    * "all": every (a, p, n).
    * "semihard-all": every (a, p, n) with ``d_ap < d_an < d_ap + α`` (the hinge is active: the same
      window as "semihard-random").
    * "semihard-fixed": per (a, p), ``n = argmin d_an`` over negatives with ``d_an > d_ap`` (the closest
      negative farther than the positive); the pair is dropped when there is none.
    * "semihard-random": per (a, p), n uniform among negatives with ``d_ap < d_an < d_ap + α``; dropped
      when there is none.
    * "hardest": per anchor with ≥ 1 positive and ≥ 1 negative, ``p = argmax d_ap`` and ``n = argmin d_an``.
    * "one-to-one": per (a, p), n uniform among all negatives of a.
    * "distance-weighted": per (a, p), n drawn with probability ∝ :func:`distance_weights` of the chord
      (Euclidean) distance ``‖e_a − e_n‖`` whatever ``distance`` is (``cutoff``, ``max_weight`` = λ);
      dropped when no negative has a positive weight.

    Ties go to the lowest index. An anchor without a positive (a class with one sample in the batch) or
    without a negative yields no triplet; an empty result is valid (the losses then give a zero).
    Random draws use ``generator`` (one ``torch.multinomial`` over the pairs, in pair order, on the
    generator's device, so a CPU generator serves CUDA embeddings too): equal generator states give equal
    triplets. The output is in lexicographic (anchor, positive, negative) order. "all" and "semihard-all"
    build an [N, N, N] mask (memory O(N³)); the others O(N²).
    """
    emb, labels = _mining_inputs(emb, labels, strategy, normalize)
    dist = pairwise_distance(emb, emb, distance)
    positive, negative = _label_masks(labels)
    if strategy in ("all", "semihard-all"):
        keep = positive.unsqueeze(2) & negative.unsqueeze(1)
        if strategy == "semihard-all":
            d_ap, d_an = dist.unsqueeze(2), dist.unsqueeze(1)
            keep = keep & (d_an > d_ap) & (d_an < d_ap + margin)
        return Triplets(*keep.nonzero(as_tuple=True))
    if strategy == "hardest":
        anchors = (positive.any(1) & negative.any(1)).nonzero(as_tuple=True)[0]
        hardest_positive = dist.masked_fill(~positive, -torch.inf).argmax(1)
        hardest_negative = dist.masked_fill(~negative, torch.inf).argmin(1)
        return Triplets(anchors, hardest_positive[anchors], hardest_negative[anchors])
    anchors, positives = positive.nonzero(as_tuple=True)
    weights = _pair_weights(
        emb,
        dist,
        negative,
        anchors,
        positives,
        strategy=strategy,
        margin=margin,
        distance=distance,
        cutoff=cutoff,
        max_weight=max_weight,
    )
    drawn = weights.sum(1) > 0
    anchors, positives, weights = anchors[drawn], positives[drawn], weights[drawn]
    if strategy == "semihard-fixed":
        negatives = dist[anchors].masked_fill(weights == 0, torch.inf).argmin(1)
    else:
        draw_device = weights.device if generator is None else generator.device
        draws = torch.multinomial(weights.to(draw_device), 1, generator=generator)
        negatives = draws.squeeze(1).to(emb.device)
    return Triplets(anchors, positives, negatives)


@torch.no_grad()
def negative_probabilities(
    emb: Tensor,
    labels: Tensor,
    anchors: Tensor,
    positives: Tensor,
    negatives: Tensor,
    *,
    strategy: str,
    margin: float = 0.2,
    distance: str = "euclidean",
    cutoff: float = DISTANCE_CUTOFF,
    max_weight: float = MAX_WEIGHT,
    normalize: bool = True,
) -> Tensor:
    """``P(n | a, p)`` [T]: the probability that :func:`mine_triplets` with ``strategy`` drew negative n
    for the pair (a, p) (the same keyword arguments as there).

    1 for the deterministic strategies (every "all"/"semihard-all" triplet is taken; "semihard-fixed" and
    "hardest" pick one); ``1/|candidates(a, p)|`` for "semihard-random" and "one-to-one";
    ``w(d_an) / Σ_{n'} w(d_an')`` over the negatives n' of a for "distance-weighted".
    """
    emb, labels = _mining_inputs(emb, labels, strategy, normalize)
    if strategy not in RANDOM_STRATEGIES:
        return torch.ones(anchors.shape[0], dtype=emb.dtype, device=emb.device)
    dist = pairwise_distance(emb, emb, distance)
    weights = _pair_weights(
        emb,
        dist,
        _label_masks(labels)[1],
        anchors,
        positives,
        strategy=strategy,
        margin=margin,
        distance=distance,
        cutoff=cutoff,
        max_weight=max_weight,
    )
    rows = torch.arange(anchors.shape[0], device=emb.device)
    return weights[rows, negatives] / weights.sum(1)


def triplet_terms(
    emb: Tensor, triplets: Triplets, *, margin: float = 0.2, hinged: bool = True, distance: str = "euclidean"
) -> Tensor:
    """Per-triplet terms [T]: hinged ``[d_ap − d_an + α]₊``, unhinged ``d_ap − d_an``
    (docs/algorithms.md#triplet-loss), with ``d`` = :func:`paired_distance`."""
    anchors, positives, negatives = triplets
    anchor_rows = emb[anchors]
    gap = paired_distance(anchor_rows, emb[positives], distance) - paired_distance(
        anchor_rows, emb[negatives], distance
    )
    return (gap + margin).clamp(min=0) if hinged else gap


def reduce_terms(terms: Tensor, reduction: str) -> TermSum:
    """Terms ``x`` [T] → :class:`TermSum`: "sum" ``(Σ_t x_t, None)``; "mean" ``(Σ_t x_t, T)``;
    "mean_nonzero" ``(Σ_{t: x_t > 0} x_t, #{t: x_t > 0})``, the mean over the positive terms."""
    if reduction == "sum":
        return TermSum(terms.sum(), None)
    if reduction == "mean":
        return TermSum(terms.sum(), torch.tensor(terms.numel(), device=terms.device))
    if reduction == "mean_nonzero":
        kept = terms > 0
        return TermSum(terms[kept].sum(), kept.sum())
    raise ValueError(f"reduction={reduction!r}: expected one of {TRIPLET_REDUCTIONS}")


def triplet_loss(
    emb: Tensor,
    triplets: Triplets,
    *,
    margin: float = 0.2,
    hinged: bool = True,
    distance: str = "euclidean",
    reduction: str = "mean",
) -> Tensor:
    """:func:`triplet_terms` reduced by ``reduction`` ("mean" over triplets, "sum", "mean_nonzero").

    With no triplet (or, for "mean_nonzero", no positive term) the value is 0 and still connected to the
    graph of ``emb`` (backward gives zero gradients, never NaN).
    """
    terms = triplet_terms(emb, triplets, margin=margin, hinged=hinged, distance=distance)
    return reduce_terms(terms, reduction).value()
