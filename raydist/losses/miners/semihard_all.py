"""``loss.miner=semihard-all``: every triplet whose hinge is active, inside the semi-hard window."""

from __future__ import annotations

import torch
from torch import Tensor

from raydist.losses.miners import MINERS, TripletMiner, Triplets, label_masks


@MINERS.register("semihard-all")
class SemihardAllTriplets(TripletMiner):
    """Every (a, p, n) with ``d_ap < d_an < d_ap + α`` (the window of "semihard-random"), in lexicographic
    order; builds an [N, N, N] mask (memory O(N³))."""

    def mine(self, emb: Tensor, labels: Tensor, generator: torch.Generator | None) -> Triplets:
        dist = self.distance.pairwise(emb, emb)
        positive, negative = label_masks(labels)
        keep = positive.unsqueeze(2) & negative.unsqueeze(1)
        d_ap, d_an = dist.unsqueeze(2), dist.unsqueeze(1)
        keep = keep & (d_an > d_ap) & (d_an < d_ap + self.margin)
        return Triplets(*keep.nonzero(as_tuple=True))
