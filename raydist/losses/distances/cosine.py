"""The cosine distance ``1 − x·y`` of unit rows (``loss.distance=cosine``)."""

from __future__ import annotations

from torch import Tensor

from raydist.losses.distances import DISTANCES, Distance


@DISTANCES.register("cosine")
class CosineDistance(Distance):
    """``1 − x·y``: the cosine distance of unit-norm rows, in [0, 2]."""

    def pairwise(self, x: Tensor, y: Tensor) -> Tensor:
        return 1.0 - x @ y.T

    def paired(self, x: Tensor, y: Tensor) -> Tensor:
        return 1.0 - (x * y).sum(-1)
