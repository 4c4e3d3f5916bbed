"""``loss.miner=one-to-one``: per positive pair, a uniform draw among all negatives of the anchor."""

from __future__ import annotations

from torch import Tensor

from raydist.losses.miners import MINERS, PairMiner


@MINERS.register("one-to-one")
class OneToOneNegatives(PairMiner):
    """Per (a, p): n uniform among all negatives of a (the uniform 1-1 sampling the skew η is measured
    against: η = 1)."""

    random = True

    def negative_weights(
        self, emb: Tensor, dist: Tensor, negative: Tensor, anchors: Tensor, positives: Tensor
    ) -> Tensor:
        return negative[anchors].to(dist.dtype)
