"""``loss.miner=distance-weighted``: distance-weighted sampling (Wu, Manmatha et al. 2017, §4)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from raydist.losses.distances import Distance, pairwise_distance
from raydist.losses.miners import MINERS, PairMiner

DISTANCE_CUTOFF = 0.5
MAX_WEIGHT = 10.0


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


@MINERS.register("distance-weighted")
class DistanceWeightedNegatives(PairMiner):
    """Per (a, p): n drawn with probability ∝ :func:`distance_weights` of the chord (Euclidean) distance
    ``‖e_a − e_n‖`` whatever the miner's distance is (``cutoff``, ``max_weight`` = λ); the pair is dropped when
    no negative has a positive weight."""

    random = True

    def __init__(
        self,
        *,
        margin: float = 0.2,
        distance: str | Distance = "euclidean",
        normalize: bool = True,
        cutoff: float = DISTANCE_CUTOFF,
        max_weight: float = MAX_WEIGHT,
    ) -> None:
        super().__init__(margin=margin, distance=distance, normalize=normalize)
        self.cutoff, self.max_weight = cutoff, max_weight

    def negative_weights(
        self, emb: Tensor, dist: Tensor, negative: Tensor, anchors: Tensor, positives: Tensor
    ) -> Tensor:
        chord = dist if self.distance.name == "euclidean" else pairwise_distance(emb, emb, "euclidean")
        weights = distance_weights(
            chord[anchors], emb.shape[1], cutoff=self.cutoff, max_weight=self.max_weight
        )
        return weights * negative[anchors]
