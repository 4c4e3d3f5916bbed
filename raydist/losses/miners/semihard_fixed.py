"""``loss.miner=semihard-fixed``: per positive pair, the closest negative farther than the positive."""

from __future__ import annotations

from torch import Tensor

from raydist.losses.miners import MINERS, PairMiner


@MINERS.register("semihard-fixed")
class SemihardFixedNegatives(PairMiner):
    """Per (a, p): ``n = argmin d_an`` over the negatives with ``d_an > d_ap``; the pair is dropped when there
    is none."""

    def negative_weights(
        self, emb: Tensor, dist: Tensor, negative: Tensor, anchors: Tensor, positives: Tensor
    ) -> Tensor:
        farther = dist[anchors] > dist[anchors, positives].unsqueeze(1)
        return (negative[anchors] & farther).to(dist.dtype)
