"""The Euclidean (chord) distance ``‖x − y‖₂`` (``loss.distance=euclidean``)."""

from __future__ import annotations

from torch import Tensor

from raydist.losses.distances import DISTANCES, Distance, safe_sqrt


@DISTANCES.register("euclidean")
class EuclideanDistance(Distance):
    """``‖x − y‖₂``; for unit rows the chord of the unit sphere, in [0, 2]."""

    def pairwise(self, x: Tensor, y: Tensor) -> Tensor:
        """From ``‖x_i‖² + ‖y_j‖² − 2 x_i·y_j`` (one matrix product), then :func:`safe_sqrt`."""
        squared = x.pow(2).sum(-1).unsqueeze(1) + y.pow(2).sum(-1).unsqueeze(0) - 2.0 * (x @ y.T)
        return safe_sqrt(squared)

    def paired(self, x: Tensor, y: Tensor) -> Tensor:
        """From the difference ``x_k − y_k``, then :func:`safe_sqrt`."""
        return safe_sqrt((x - y).pow(2).sum(-1))
