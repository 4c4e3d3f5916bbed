"""Label-noise maths (docs/algorithms.md#label-noise, #sampler-skew, #noise-tolerance): pair flip rates
q₊/q₋ under symmetric noise, the sampler skew η measured from mined pairs, and the tolerance condition
raydist checks."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch


def _check_noise(p: float, num_classes: int) -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"flip probability p must lie in [0, 1), got {p}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")


def pair_flip_rates(p: float, num_classes: int) -> tuple[float, float]:
    """``(q₊, q₋)`` for labels flipped independently with probability p to a uniform other class (K classes).

    q₊ = P(observed labels differ | same true class) = 1 − (1−p)² − p²/(K−1);
    q₋ = P(observed labels agree | different true classes) = (2p(K−1) − K p²)/(K−1)².
    """
    _check_noise(p, num_classes)
    k = num_classes
    q_pos = 1.0 - (1.0 - p) ** 2 - p**2 / (k - 1)
    q_neg = (2.0 * p * (k - 1) - k * p**2) / (k - 1) ** 2
    return q_pos, q_neg


def effective_flip_rates(
    p: float, num_classes: int, eta_pos: float = 1.0, eta_neg: float = 1.0
) -> tuple[float, float]:
    """``(η₊·q₊, η₋·q₋)``: the share of noisy pairs among drawn positives / negatives when the sampler
    draws noisy pairs η times as often as uniform sampling would (first-order; may exceed 1 for large η)."""
    for name, eta in (("eta_pos", eta_pos), ("eta_neg", eta_neg)):
        if not (math.isfinite(eta) and eta >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {eta}")
    q_pos, q_neg = pair_flip_rates(p, num_classes)
    return eta_pos * q_pos, eta_neg * q_neg


def noise_tolerance(p: float, num_classes: int, eta_pos: float = 1.0, eta_neg: float = 1.0) -> bool:
    """The condition raydist checks: noisy pairs stay a minority in expectation after the sampler skew,
    i.e. ``η₊·q₊ < 1/2`` **and** ``η₋·q₋ < 1/2`` (both strict), with q₊, q₋ from :func:`pair_flip_rates`
    and η₊, η₋ from :func:`sampler_skew` (1 = uniform sampling)."""
    eff_pos, eff_neg = effective_flip_rates(p, num_classes, eta_pos, eta_neg)
    return eff_pos < 0.5 and eff_neg < 0.5


def _as_array(x: np.ndarray | torch.Tensor | Sequence[float] | float, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim > 1:
        raise ValueError(f"{name} must be a scalar or 1-D, got shape {arr.shape}")
    return arr


def sampler_skew(
    probabilities: np.ndarray | torch.Tensor | Sequence[float],
    num_candidates: np.ndarray | torch.Tensor | Sequence[int] | int,
) -> float:
    """Skew η of a sampler relative to uniform 1-1 sampling, measured from the pairs it drew.

    For each drawn (anchor, positive) pair m, ``probabilities[m]`` is the probability q_m the sampler gave
    the negative it drew, among the ``num_candidates[m]`` = n_m candidate negatives of that anchor (a scalar
    n applies to all pairs). ``η = (1/M) Σ_m q_m / (1/n_m) = (1/M) Σ_m n_m q_m``. Uniform sampling gives
    exactly 1; its expectation under the sampler is ``n Σ_j q_j² ≥ 1`` (equality iff uniform), so a sampler
    that concentrates on close negatives has η > 1. The same measure with the probability of the drawn
    positive among the anchor's candidate positives gives η₊.
    """
    q, n = _as_array(probabilities, "probabilities"), _as_array(num_candidates, "num_candidates")
    if q.ndim != 1 or len(q) == 0:
        raise ValueError(f"probabilities must be a non-empty 1-D array, got shape {q.shape}")
    if n.ndim == 1 and n.shape != q.shape:
        raise ValueError(f"num_candidates has shape {n.shape}; expected a scalar or {q.shape}, one per pair")
    if not ((q > 0) & (q <= 1)).all():
        raise ValueError("probabilities of drawn pairs must lie in (0, 1]")
    if not ((n >= 1) & (n == np.round(n))).all():
        raise ValueError("num_candidates must be whole numbers >= 1")
    return float(np.mean(q * n))
