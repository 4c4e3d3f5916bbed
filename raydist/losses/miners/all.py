"""``loss.miner=all``: every (anchor, positive, negative) of the batch."""

from __future__ import annotations

import torch
from torch import Tensor

from raydist.losses.miners import MINERS, TripletMiner, Triplets, label_masks


@MINERS.register("all")
class AllTriplets(TripletMiner):
    """Every (a, p, n), in lexicographic order; builds an [N, N, N] mask (memory O(N³))."""

    def mine(self, emb: Tensor, labels: Tensor, generator: torch.Generator | None) -> Triplets:
        positive, negative = label_masks(labels)
        return Triplets(*(positive.unsqueeze(2) & negative.unsqueeze(1)).nonzero(as_tuple=True))
