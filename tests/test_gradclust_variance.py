"""Variance meter: the two statistics against numpy, and GC's normalized variance far below SGD's on data
made of duplicated examples (K distinct gradients, K clusters); the meter leaves training state alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_gradclust_layers import CLASSES, DTYPE, MLP

from raydist.gradclust import GradientClustering, gradient_variance, measure_gradient_variance, weighted_mean


def test_gradient_variance_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    estimates = rng.normal(size=(6, 10)) * rng.uniform(0.1, 3.0, size=10)
    estimates[:, 3] = 2.5  # a coordinate that never varies contributes 0 to both
    var, nvar = gradient_variance(torch.tensor(estimates))
    assert var == pytest.approx(np.var(estimates, axis=0, ddof=1).sum(), rel=1e-12)
    spread = ((estimates - estimates.mean(0)) ** 2).sum(0)
    assert nvar == pytest.approx(np.mean(spread / ((estimates**2).sum(0) + 1e-7)), rel=1e-12)
    with pytest.raises(ValueError):
        gradient_variance(torch.zeros(1, 3))


def per_example_loss(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    """Cross-entropy per example; draws from the global RNG (like dropout) without changing the value."""
    x, y = batch
    return F.cross_entropy(model(x) + 0 * torch.randn(()), y, reduction="none")


def test_gc_variance_is_far_below_sgd_on_duplicated_examples() -> None:
    torch.manual_seed(0)
    model = MLP()
    distinct, copies = 4, 8
    g = torch.Generator().manual_seed(0)
    x = torch.randn(distinct, 6, generator=g, dtype=DTYPE).repeat(copies, 1)
    y = (torch.arange(distinct) % CLASSES).repeat(copies)
    ids = 100 + torch.arange(x.shape[0])
    gc = GradientClustering(model, distinct, mode="batch", seed=0)
    for _ in range(10):  # passes of two batches of 16, then a U-step
        for rows in torch.randperm(x.shape[0], generator=g).split(16):
            with gc.capture():
                loss = F.cross_entropy(model(x[rows]), y[rows], reduction="sum")
            loss.backward()
            model.zero_grad(set_to_none=True)
            gc.after_backward(ids[rows])
        gc.update()
    clusters = gc.assignments(ids).view(copies, distinct)
    assert (clusters == clusters[0]).all() and len(set(clusters[0].tolist())) == distinct
    assert gc.total_distortion < 1e-12
    rng_before = torch.get_rng_state()
    stats = measure_gradient_variance(
        model,
        weighted_mean(per_example_loss),
        list(zip(x, y, strict=False)),
        gc,
        batch_size=8,
        num_batches=20,
        generator=torch.Generator().manual_seed(1),
        sample_ids=ids,
    )
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert all(p.grad is None for p in model.parameters())
    assert stats["gvar/sgd_nvar"] > 0.05 and stats["gvar/sgd_var"] > 1e-3
    assert stats["gvar/gc_nvar"] < 1e-12 * stats["gvar/sgd_nvar"]
    assert stats["gvar/gc_var"] < 1e-12 * stats["gvar/sgd_var"]
    assert stats["gvar/gc_distortion"] == gc.total_distortion
