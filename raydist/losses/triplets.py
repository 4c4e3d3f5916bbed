"""The triplet loss (docs/algorithms.md#triplet-loss): one term per mined triplet, reduced. The miners are
:mod:`raydist.losses.miners` (one class a module); :func:`mine_triplets` is the one-call form of a registered
miner.
"""

from __future__ import annotations

import torch
from torch import Tensor

from raydist.losses.distances import Distance, get_distance
from raydist.losses.miners import MINERS, TripletMiner, Triplets, check_labels
from raydist.losses.miners.distance_weighted import DISTANCE_CUTOFF, MAX_WEIGHT, DistanceWeightedNegatives
from raydist.losses.reducers import Reducer, TermSum, get_reducer, reduce_terms


def _build(strategy: str, cutoff: float, max_weight: float, **options: object) -> TripletMiner:
    """The miner ``strategy`` with ``options``; the distance-weighted sampler also with ``cutoff`` and
    ``max_weight`` (the other miners have no such options)."""
    cls = MINERS.get(strategy)
    if isinstance(cls, type) and issubclass(cls, DistanceWeightedNegatives):
        options.update(cutoff=cutoff, max_weight=max_weight)
    return cls(**options)


@torch.no_grad()
def mine_triplets(
    emb: Tensor,
    labels: Tensor,
    *,
    strategy: str,
    margin: float = 0.2,
    distance: str | Distance = "euclidean",
    generator: torch.Generator | None = None,
    cutoff: float = DISTANCE_CUTOFF,
    max_weight: float = MAX_WEIGHT,
    normalize: bool = True,
) -> Triplets:
    """Triplets of a batch of embeddings ``emb`` [N, D] with integer ``labels`` [N], mined by the miner
    registered as ``strategy`` (:data:`raydist.losses.miners.MINERS`; docs/algorithms.md#triplet-miners) built
    with ``margin``, ``distance`` and ``normalize`` (``cutoff``, ``max_weight``: the distance-weighted
    sampler's), random draws from ``generator``."""
    miner = _build(strategy, cutoff, max_weight, margin=margin, distance=distance, normalize=normalize)
    return miner(emb, labels, generator)


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
    distance: str | Distance = "euclidean",
    cutoff: float = DISTANCE_CUTOFF,
    max_weight: float = MAX_WEIGHT,
    normalize: bool = True,
) -> Tensor:
    """``P(n | a, p)`` [T]: the probability that :func:`mine_triplets` with ``strategy`` drew negative n for the
    pair (a, p) (the same keyword arguments as there; :meth:`raydist.losses.miners.TripletMiner.probabilities`)."""
    miner = _build(strategy, cutoff, max_weight, margin=margin, distance=distance, normalize=normalize)
    return miner.probabilities(emb, labels, Triplets(anchors, positives, negatives))


def triplet_terms(
    emb: Tensor,
    triplets: Triplets,
    *,
    margin: float = 0.2,
    hinged: bool = True,
    distance: str | Distance = "euclidean",
) -> Tensor:
    """Per-triplet terms [T]: hinged ``[d_ap − d_an + α]₊``, unhinged ``d_ap − d_an``
    (docs/algorithms.md#triplet-loss), with ``d`` = the distance's :meth:`~raydist.losses.distances.Distance.paired`."""
    anchors, positives, negatives = triplets
    anchor_rows, distance = emb[anchors], get_distance(distance)
    gap = distance.paired(anchor_rows, emb[positives]) - distance.paired(anchor_rows, emb[negatives])
    return (gap + margin).clamp(min=0) if hinged else gap


def triplet_loss(
    emb: Tensor,
    triplets: Triplets,
    *,
    margin: float = 0.2,
    hinged: bool = True,
    distance: str | Distance = "euclidean",
    reduction: str | Reducer = "mean",
) -> Tensor:
    """:func:`triplet_terms` reduced by ``reduction`` (a registered reducer: "mean" over triplets, "sum",
    "mean_nonzero"; :mod:`raydist.losses.reducers`).

    With no triplet (or, for "mean_nonzero", no positive term) the value is 0 and still connected to the
    graph of ``emb`` (backward gives zero gradients, never NaN).
    """
    terms = triplet_terms(emb, triplets, margin=margin, hinged=hinged, distance=distance)
    return get_reducer(reduction)(terms)


__all__ = [
    "TermSum",
    "Triplets",
    "check_labels",
    "mine_triplets",
    "negative_probabilities",
    "reduce_terms",
    "triplet_loss",
    "triplet_terms",
]
