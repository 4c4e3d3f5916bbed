"""Margin loss (Wu, Manmatha et al. 2017; docs/algorithms.md#margin-loss): pair terms ``[α + t(d − β)]₊``
around a learnable boundary β (one, or one per class), on the pairs of mined triplets.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from raydist.losses.distances import Distance, get_distance
from raydist.losses.miners import Triplets, check_labels
from raydist.losses.reducers import TermSum, reduce_terms
from raydist.losses.triplets import mine_triplets

PAIR_REDUCTIONS = {"mean": "mean_nonzero", "sum": "sum"}  # the margin loss's mean is over non-zero pair terms


def beta_per_anchor(beta: Tensor, anchor_labels: Tensor) -> Tensor:
    """β of each anchor [T]: a 0-d ``beta`` (one boundary) for all, a [K] ``beta`` indexed by the label."""
    if beta.ndim == 0:
        return beta.expand(anchor_labels.shape[0])
    if beta.ndim == 1:
        return beta[anchor_labels]
    raise ValueError(
        f"beta must be a float, a 0-d tensor or a per-class [K] tensor, got shape {tuple(beta.shape)}"
    )


class MarginBeta(nn.Module):
    """Learnable margin-loss boundary β: one scalar, or one per class when ``num_classes`` is given."""

    def __init__(
        self, num_classes: int | None = None, init: float = 1.2, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        shape = () if num_classes is None else (num_classes,)
        self.beta = nn.Parameter(torch.full(shape, init, dtype=dtype))

    def forward(self, labels: Tensor) -> Tensor:
        """β of each row [len(labels)] (:func:`beta_per_anchor`)."""
        return beta_per_anchor(self.beta, labels)


def margin_terms(
    emb: Tensor,
    triplets: Triplets,
    *,
    beta: float | Tensor,
    alpha: float = 0.2,
    distance: str | Distance = "euclidean",
) -> Tensor:
    """Pair terms ``[α + t(d − β)]₊`` [2T]: first the positive pairs (a, p) of the T triplets (t = +1,
    ``[α + d_ap − β]₊``), then their negative pairs (a, n) (t = −1, ``[α − d_an + β]₊``).

    ``beta`` is a float, a 0-d tensor, or a [T] tensor of each triplet's β; ``d`` is the distance's
    :meth:`~raydist.losses.distances.Distance.paired`.
    """
    anchors, positives, negatives = triplets
    anchor_rows, distance = emb[anchors], get_distance(distance)
    d_ap = distance.paired(anchor_rows, emb[positives])
    d_an = distance.paired(anchor_rows, emb[negatives])
    return torch.cat([(alpha + d_ap - beta).clamp(min=0), (alpha - d_an + beta).clamp(min=0)])


def margin_loss_parts(
    emb: Tensor,
    labels: Tensor,
    triplets: Triplets,
    *,
    beta: float | Tensor,
    alpha: float = 0.2,
    nu: float = 0.0,
    distance: str | Distance = "euclidean",
    reduction: str = "mean",
) -> TermSum:
    """Margin loss of given triplets before its division (a :class:`TermSum`), with
    ``total = Σ_pairs [α + t(d − β_a)]₊ + ν Σ_triplets β_a``.

    ``β_a`` is :func:`beta_per_anchor` of ``beta`` (float, 0-d, or per-class [K]) at the anchor's label.
    "mean" divides by the number of pairs with a non-zero term (as in the paper; the ν regulariser is
    divided by it too), "sum" does not divide.
    """
    if reduction not in PAIR_REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}: expected one of {tuple(PAIR_REDUCTIONS)}")
    labels = check_labels(emb, labels)
    beta = torch.as_tensor(beta, dtype=emb.dtype, device=emb.device)
    anchor_beta = beta_per_anchor(beta, labels[triplets[0]])
    terms = margin_terms(emb, triplets, beta=anchor_beta, alpha=alpha, distance=distance)
    parts = reduce_terms(terms, PAIR_REDUCTIONS[reduction])
    return parts._replace(total=parts.total + nu * anchor_beta.sum())


def margin_loss(
    emb: Tensor,
    labels: Tensor,
    *,
    alpha: float = 0.2,
    beta: float | Tensor = 1.2,
    triplets: Triplets | None = None,
    strategy: str = "distance-weighted",
    distance: str | Distance = "euclidean",
    generator: torch.Generator | None = None,
    reduction: str = "mean",
    nu: float = 0.0,
) -> Tensor:
    """Margin loss of a labelled batch (docs/algorithms.md#margin-loss; α = 0.2, β₀ = 1.2):
    :func:`margin_loss_parts` reduced.

    Each triplet (a, p, n) gives the positive pair (a, p) and the negative pair (a, n). Without
    ``triplets`` they are mined by :func:`mine_triplets` with ``strategy`` (semi-hard windows use
    ``margin=alpha``) and ``generator``. "mean" divides by the number of non-zero pair terms; with no
    triplet (or no non-zero term) the value is a graph-connected 0 (zero gradients, never NaN).
    """
    if triplets is None:
        triplets = mine_triplets(
            emb, labels, strategy=strategy, margin=alpha, distance=distance, generator=generator
        )
    parts = margin_loss_parts(
        emb, labels, triplets, beta=beta, alpha=alpha, nu=nu, distance=distance, reduction=reduction
    )
    return parts.value()
