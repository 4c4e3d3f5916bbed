"""``loss.miner=semihard-random``: per positive pair, a uniform draw inside the semi-hard window."""

from __future__ import annotations

from torch import Tensor

from raydist.losses.miners import MINERS, PairMiner


@MINERS.register("semihard-random")
class SemihardRandomNegatives(PairMiner):
    """Per (a, p): n uniform among the negatives with ``d_ap < d_an < d_ap + α``; the pair is dropped when there
    is none."""

    random = True

    def negative_weights(
        self, emb: Tensor, dist: Tensor, negative: Tensor, anchors: Tensor, positives: Tensor
    ) -> Tensor:
        d_an, d_ap = dist[anchors], dist[anchors, positives].unsqueeze(1)
        return (negative[anchors] & (d_an > d_ap) & (d_an < d_ap + self.margin)).to(dist.dtype)
