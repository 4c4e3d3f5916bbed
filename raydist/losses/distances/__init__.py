"""Distances between L2-normalised embeddings for metric-learning losses: Euclidean (chord) and cosine.

Pairwise functions give ``[len(x), len(y)]`` blocks; paired ones compare row k of x with row k of y.
"""

from __future__ import annotations

from torch import Tensor

from raydist.choices import DISTANCES

SQUARED_EPS = 1e-12


def _check(distance: str) -> None:
    if distance not in DISTANCES:
        raise ValueError(f"distance={distance!r}: expected one of {DISTANCES}")


def safe_sqrt(squared: Tensor) -> Tensor:
    """``sqrt(max(d², ε))`` with ε = 1e-12: below ε the clamp passes no gradient, so identical rows
    (d² = 0, or slightly negative from rounding) get distance 1e-6 and gradient exactly 0, never NaN."""
    return squared.clamp(min=SQUARED_EPS).sqrt()


def pairwise_distance(x: Tensor, y: Tensor, distance: str = "euclidean") -> Tensor:
    """``D[i, j] = d(x_i, y_j)``, shape ``[len(x), len(y)]``.

    "euclidean": ``‖x_i − y_j‖₂`` from ``‖x_i‖² + ‖y_j‖² − 2 x_i·y_j`` (one matrix product, then
    :func:`safe_sqrt`); "cosine": ``1 − x_i·y_j`` (the cosine distance of unit-norm rows).
    """
    _check(distance)
    dots = x @ y.T
    if distance == "cosine":
        return 1.0 - dots
    squared = x.pow(2).sum(-1).unsqueeze(1) + y.pow(2).sum(-1).unsqueeze(0) - 2.0 * dots
    return safe_sqrt(squared)


def paired_distance(x: Tensor, y: Tensor, distance: str = "euclidean") -> Tensor:
    """``d_k = d(x_k, y_k)``, shape ``[N]``: "euclidean" ``‖x_k − y_k‖₂`` (from the difference, then
    :func:`safe_sqrt`), "cosine" ``1 − x_k·y_k``."""
    _check(distance)
    if distance == "cosine":
        return 1.0 - (x * y).sum(-1)
    return safe_sqrt((x - y).pow(2).sum(-1))
