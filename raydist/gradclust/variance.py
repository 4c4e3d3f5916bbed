"""Gradient variance meter: variance and normalized variance of SGD and GC mini-batch gradient estimates,
from extra batches drawn with their own generator (docs/algorithms.md#gradient-variance).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import default_collate

from raydist.gradclust.clustering import GradientClustering
from raydist.gradclust.sampler import StratifiedSampler

LossFn = Callable[[nn.Module, Any], Tensor]
Estimate = Callable[[nn.Module, Any, Tensor], Tensor]


def weighted_mean(loss_fn: LossFn) -> Estimate:
    """The estimate of a loss that is a mean of per-example terms: ``loss_fn(model, batch)`` gives ℓ [B] and
    the estimate is ``∇ Σ_i w_i ℓ_i / B``."""

    def estimate(model: nn.Module, batch: Any, weights: Tensor) -> Tensor:
        losses = loss_fn(model, batch)
        return (weights.to(losses) * losses).sum() / weights.shape[0]

    return estimate


def gradient_variance(estimates: Tensor) -> tuple[float, float]:
    """``(Σ_j Var_t(ĝ_tj), mean_j Σ_t (ĝ_tj − ḡ_j)² / (Σ_t ĝ_tj² + 1e-7))`` for T estimates ĝ [T, D].

    Var_t is the unbiased sample variance (divisor T − 1); the normalized variance is that of
    docs/algorithms.md#gradient-variance.
    """
    if estimates.shape[0] < 2:
        raise ValueError("need at least two gradient estimates")
    squares = (estimates - estimates.mean(0)).square().sum(0)
    variance = squares.sum() / (estimates.shape[0] - 1)
    normalized = (squares / (estimates.square().sum(0) + 1e-7)).mean()
    return float(variance), float(normalized)


def _flat_gradient(
    model: nn.Module, estimate: Estimate, dataset: Sequence, indices: Tensor, weights: Tensor
) -> Tensor:
    """∇ of ``estimate(model, batch, weights)`` over the trainable parameters, flattened (zeros for unused
    ones)."""
    params = [p for p in model.parameters() if p.requires_grad]
    loss = estimate(model, default_collate([dataset[i] for i in indices.tolist()]), weights)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat(
        [(torch.zeros_like(p) if g is None else g).flatten() for p, g in zip(params, grads, strict=False)]
    )


def measure_gradient_variance(
    model: nn.Module,
    estimate: Estimate,
    dataset: Sequence,
    clustering: GradientClustering,
    *,
    batch_size: int,
    num_batches: int,
    generator: torch.Generator,
    sample_ids: Tensor | None = None,
    allocation: str = "proportional",
) -> dict[str, float]:
    """SGD vs GC gradient variance from ``num_batches`` (T) extra batches of each kind.

    ``estimate(model, batch, weights)`` is the scalar whose gradient is the estimate from a batch collated
    from ``dataset[i]`` with row weights [B] (float64): :func:`weighted_mean` for per-example losses
    (``∇ Σ_i w_i ℓ_i / B``), :meth:`raydist.tasks.Task.local_loss` with ``row_weights`` for any task loss
    (``Σ_i w_i c_i`` over the rows' contributions; for losses that are not sums over rows the GC estimate is
    a heuristic, not unbiased). SGD batches: B distinct rows uniform over the dataset, weights 1; GC
    batches: :class:`StratifiedSampler` over ``clustering.assignments(sample_ids)`` (sample_ids default: row
    numbers) with its weights. All draws use ``generator``; the global RNG state (e.g.
    dropout) is restored afterwards and parameter ``.grad`` is untouched, so training is not perturbed.
    Pass the bare module, not a DDP wrapper (the estimates are this worker's own).
    Returns gvar/{sgd,gc}_{var,nvar} (:func:`gradient_variance`) and gvar/gc_distortion (the clustering's
    total distortion after its last U-step).
    """
    ids = torch.arange(len(dataset)) if sample_ids is None else sample_ids
    strata = clustering.assignments(ids)
    sampler = StratifiedSampler(strata, batch_size, allocation=allocation, dtype=torch.float64)
    ones = torch.ones(batch_size, dtype=torch.float64)
    cuda = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    sgd, gc = [], []
    with torch.random.fork_rng(devices=cuda):
        for _ in range(num_batches):
            rows = torch.randperm(len(dataset), generator=generator)[:batch_size]
            sgd.append(_flat_gradient(model, estimate, dataset, rows, ones))
        for _ in range(num_batches):
            batch = sampler.sample(generator)
            gc.append(_flat_gradient(model, estimate, dataset, batch.indices, batch.weights))
    sgd_var, sgd_nvar = gradient_variance(torch.stack(sgd))
    gc_var, gc_nvar = gradient_variance(torch.stack(gc))
    return {
        "gvar/sgd_var": sgd_var,
        "gvar/sgd_nvar": sgd_nvar,
        "gvar/gc_var": gc_var,
        "gvar/gc_nvar": gc_nvar,
        "gvar/gc_distortion": clustering.total_distortion,
    }
