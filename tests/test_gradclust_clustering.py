"""Seeding, A-step (N_k+1 weighting), U-steps (least-squares factor updates, batch and online) and
re-seeding of GradientClustering vs a numpy k-means step on explicitly materialised per-example gradients.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_gradclust_layers import (
    CLASSES,
    DTYPE,
    Mixed,
    gradient_matrices,
    make_inputs,
    per_example_gradients,
    sum_loss,
)
from torch import nn

from raydist.gradclust import GradientClustering

K = 3


def step(
    gc: GradientClustering,
    model: nn.Module,
    inputs: tuple,
    targets: torch.Tensor,
    ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Forward inside capture, backward of the SUM loss, after_backward; returns the assignments."""
    with gc.capture():
        loss = sum_loss(model, inputs, targets)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return gc.after_backward(torch.arange(targets.shape[0]) if ids is None else ids)


def batch(seed: int, size: int = 12) -> tuple[tuple, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return make_inputs("mixed", size, g), torch.randint(0, CLASSES, (size,), generator=g)


def materialised(model: nn.Module, inputs: tuple, targets: torch.Tensor) -> dict[str, np.ndarray]:
    """Per-example gradient matrices [B, n_out, n_in] (torch.func), as numpy."""
    grads = per_example_gradients(model, inputs, targets)
    return {n: m.numpy() for n, m in gradient_matrices(model, grads).items()}


def np_distances(g: dict[str, np.ndarray], centres: dict[str, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Σ_layers ‖d_k c_kᵀ − G_i‖² → [B, K]."""
    return sum(
        ((np.einsum("ko,ki->koi", d, c)[None] - g[n][:, None]) ** 2).sum((2, 3))
        for n, (d, c) in centres.items()
    )


def lstsq_factor(
    members: np.ndarray, held: np.ndarray, old_centre: np.ndarray, prior: float, solve_input: bool
) -> np.ndarray:
    """argmin_x prior‖C(x) − old‖² + Σ_i ‖C(x) − G_i‖² with C(x) = held xᵀ (input) or x heldᵀ (output),
    by numpy least squares on the stacked rows."""
    mats = [m if solve_input else m.T for m in members]
    targets = mats + ([np.sqrt(prior) * (old_centre if solve_input else old_centre.T)] if prior else [])
    scales = [1.0] * len(mats) + ([np.sqrt(prior)] if prior else [])
    design = np.concatenate([s * held[:, None] for s in scales])
    return np.linalg.lstsq(design, np.concatenate(targets), rcond=None)[0][0]


def reference_u_step(g: dict, a: np.ndarray, centres: dict, counts: np.ndarray, decay: float, inputs: bool):
    """One U-step: for each layer and cluster, the factor due solved by least squares with the other held."""
    new = {}
    for n, (d, c) in centres.items():
        d, c = d.copy(), c.copy()
        for k in range(K):
            members, prior = g[n][a == k], decay * counts[k]
            if len(members) == 0 and prior == 0:
                continue
            old = np.outer(d[k], c[k])
            if inputs:
                c[k] = lstsq_factor(members, d[k], old, prior, True)
            else:
                d[k] = lstsq_factor(members, c[k], old, prior, False)
        new[n] = (d, c)
    return new


def load_centres(gc: GradientClustering, centres: dict, counts: np.ndarray) -> None:
    """Start ``gc`` from given centres and counts (fresh window, no U-step yet)."""
    state = gc.state_dict()
    state["centres"] = {n: {"d": torch.tensor(d), "c": torch.tensor(c)} for n, (d, c) in centres.items()}
    state["counts"] = torch.tensor(counts, dtype=torch.float64)
    gc.load_state_dict(state)


def random_np_centres(model: nn.Module, rng: np.random.Generator) -> dict:
    g = materialised(model, *batch(99, 2))
    return {
        n: (rng.normal(size=(K, m.shape[1])), 0.5 * rng.normal(size=(K, m.shape[2]))) for n, m in g.items()
    }


def test_seeding_takes_the_documented_rows() -> None:
    torch.manual_seed(0)
    model = Mixed()
    inputs, targets = batch(1, 10)
    gc = GradientClustering(model, K, mode="batch", seed=5)
    step(gc, model, inputs, targets)
    rows = torch.randperm(10, generator=torch.Generator().manual_seed(5))[:K].tolist()
    g = materialised(model, inputs, targets)
    image, tokens = inputs
    patches = F.unfold(image, 2, stride=2)  # [B, 4, P=4]
    for k, r in enumerate(rows):
        out, embed, conv = (gc.centres[n] for n in ("out", "embed", "conv"))
        np.testing.assert_allclose(np.outer(out.d[k], out.c[k]), g["out"][r], rtol=1e-12, atol=1e-14)
        hist = np.bincount(tokens[r].numpy(), minlength=6).astype(float)
        conv_in = np.append(patches[r].sum(1).numpy(), patches.shape[2])  # bias column: Σ_p 1 = P
        for centre, c, name in ((embed, hist, "embed"), (conv, conv_in, "conv")):
            np.testing.assert_allclose(centre.c[k], c, rtol=1e-12)
            np.testing.assert_allclose(centre.d[k], g[name][r] @ c / (c @ c), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("mode", ["batch", "online"])
def test_a_and_u_steps_match_numpy(mode: str) -> None:
    torch.manual_seed(0)
    model = Mixed()
    rng = np.random.default_rng(3)
    decay = 0.5 if mode == "online" else 0.0
    gc = GradientClustering(model, K, mode=mode, decay=decay or None, update_every=1, min_cluster_size=0)
    centres, counts = random_np_centres(model, rng), np.array([6.0, 0.0, 2.0])
    load_centres(gc, centres, counts)
    distortion, weighted_ever_differs = np.zeros(K), False
    for u, seed in enumerate((11, 12, 13)):
        inputs, targets = batch(seed)
        g = materialised(model, inputs, targets)
        dist = np_distances(g, centres)
        want = np.argmin((counts + 1) * dist, axis=1)
        weighted_ever_differs |= bool((np.argmin(dist, axis=1) != want).any())
        got = step(gc, model, inputs, targets).numpy()
        np.testing.assert_array_equal(got, want)
        if mode == "batch":
            gc.update()
        n = np.bincount(want, minlength=K).astype(float)
        window = np.bincount(want, weights=dist[np.arange(len(want)), want], minlength=K)
        centres = reference_u_step(g, want, centres, counts, decay, inputs=u % 2 == 0)
        counts, distortion = decay * counts + n, decay * distortion + window
        for name, (d, c) in centres.items():
            np.testing.assert_allclose(gc.centres[name].d.numpy(), d, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(gc.centres[name].c.numpy(), c, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(gc.counts.numpy(), counts, rtol=1e-12)
        np.testing.assert_allclose(gc.distortion.numpy(), distortion, rtol=1e-10)
        assert gc.objective == pytest.approx(float(counts @ distortion), rel=1e-10)
        assert gc.total_distortion == pytest.approx(float(distortion.sum()), rel=1e-10)
    assert weighted_ever_differs  # the (N_k + 1) factor changed at least one assignment
    assert gc.updates == 3 and gc.reseeds == 0


def test_u_step_reaches_the_mean_when_it_is_rank_one() -> None:
    """A cluster of identical gradients: after a c-step and a d-step its centre is that gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5, dtype=DTYPE), nn.Tanh(), nn.Linear(5, CLASSES, dtype=DTYPE))
    x = torch.randn(1, 4, dtype=DTYPE).expand(6, 4)
    y = torch.zeros(6, dtype=torch.long)
    gc = GradientClustering(model, 1, mode="batch")
    rng = np.random.default_rng(0)
    g = {n: m.numpy() for n, m in gradient_matrices(model, per_example_gradients(model, (x,), y)).items()}
    load_centres(
        gc,
        {n: (rng.normal(size=(1, m.shape[1])), rng.normal(size=(1, m.shape[2]))) for n, m in g.items()},
        np.zeros(1),
    )
    for _ in range(2):  # a c-step, then a d-step
        with gc.capture():
            loss = F.cross_entropy(model(x), y, reduction="sum")
        loss.backward()
        gc.after_backward()
        gc.update()
    for name, centre in gc.centres.items():
        np.testing.assert_allclose(np.outer(centre.d[0], centre.c[0]), g[name][0], rtol=1e-10, atol=1e-13)


def test_empty_cluster_is_reseeded_by_splitting() -> None:
    torch.manual_seed(0)
    model = Mixed()
    rng = np.random.default_rng(2)
    gc = GradientClustering(model, K, mode="batch", min_cluster_size=1.0, split_noise=0.01, seed=7)
    centres = random_np_centres(model, rng)
    centres = {n: (d, c * np.array([[1.0], [1.0], [1e3]])) for n, (d, c) in centres.items()}  # cluster 2 far
    load_centres(gc, centres, np.zeros(K))
    inputs, targets = batch(21)
    g = materialised(model, inputs, targets)
    dist = np_distances(g, centres)
    a = np.argmin(dist, axis=1)
    assert 2 not in a and {0, 1} <= set(a)
    step(gc, model, inputs, targets)
    gc.update()
    solved = reference_u_step(g, a, centres, np.zeros(K), 0.0, inputs=True)
    n = np.bincount(a, minlength=K).astype(float)
    distortion = np.bincount(a, weights=dist[np.arange(len(a)), a], minlength=K)
    assert gc.objective == pytest.approx(float(n @ distortion), rel=1e-10)  # reported before the split
    m = int(np.argmax(distortion))
    generator = torch.Generator().manual_seed(7)
    for name in gc.layers:
        d, c = solved[name]
        z = torch.randn(c.shape[1], generator=generator, dtype=torch.float64).numpy()
        r = 0.01 * z / np.linalg.norm(z) * np.linalg.norm(c[m])
        got = gc.centres[name]
        np.testing.assert_allclose(got.c[2].numpy(), c[m] + r, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got.c[m].numpy(), c[m] - r, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got.d[2].numpy(), d[m], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got.d[1 - m].numpy(), d[1 - m], rtol=1e-10, atol=1e-12)
    assert gc.counts[2] == gc.counts[m] == n[m] / 2 and gc.counts[1 - m] == n[1 - m]
    assert gc.distortion[2].item() == pytest.approx(distortion[m] / 2, rel=1e-10)
    assert gc.reseeds == 1
