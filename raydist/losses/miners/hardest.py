"""``loss.miner=hardest``: per anchor, its farthest positive and its closest negative (batch-hard)."""

from __future__ import annotations

import torch
from torch import Tensor

from raydist.losses.miners import MINERS, TripletMiner, Triplets, label_masks


@MINERS.register("hardest")
class HardestTriplets(TripletMiner):
    """Per anchor with ≥ 1 positive and ≥ 1 negative: ``p = argmax d_ap``, ``n = argmin d_an``."""

    def mine(self, emb: Tensor, labels: Tensor, generator: torch.Generator | None) -> Triplets:
        dist = self.distance.pairwise(emb, emb)
        positive, negative = label_masks(labels)
        anchors = (positive.any(1) & negative.any(1)).nonzero(as_tuple=True)[0]
        hardest_positive = dist.masked_fill(~positive, -torch.inf).argmax(1)
        hardest_negative = dist.masked_fill(~negative, torch.inf).argmin(1)
        return Triplets(anchors, hardest_positive[anchors], hardest_negative[anchors])
