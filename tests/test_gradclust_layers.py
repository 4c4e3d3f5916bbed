"""Rank-1/Gram distances from captured layer factors vs brute force on per-example gradients that
torch.func (vmap of grad of the per-example loss) materialises, float64; unsupported layers are listed.

The models here (and :func:`gradient_matrices`) are shared by the other test_gradclust_* files.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from raydist.gradclust import (
    GradientClustering,
    LayerCapture,
    RankOneCentres,
    gram_is_cheaper,
    scan_layers,
    squared_distances,
    unsupported_layers,
)
from raydist.gradclust.centres import PreparedCentres, StackedBuffers, batch_terms, distances_from, stackable
from raydist.gradclust.layers import factor_shape, has_bias

DTYPE = torch.float64
CLASSES = 3


class MLP(nn.Module):
    """Linear layers with and without bias on [B, 6] inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 7, dtype=DTYPE)
        self.fc2 = nn.Linear(7, 5, bias=False, dtype=DTYPE)
        self.out = nn.Linear(5, CLASSES, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


class SequenceMLP(nn.Module):
    """Linear layers applied per step of [B, 3, 9] inputs: g_i = Σ_t δ_it a_itᵀ (Gram and dense paths)."""

    def __init__(self) -> None:
        super().__init__()
        self.step1 = nn.Linear(9, 8, dtype=DTYPE)
        self.step2 = nn.Linear(8, 2, bias=False, dtype=DTYPE)
        self.out = nn.Linear(6, CLASSES, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.step2(torch.tanh(self.step1(x)))).flatten(1))


class CNN(nn.Module):
    """Conv2d with stride, padding and dilation (dense path), strided Conv2d without bias (Gram path)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 3, stride=2, padding=2, dilation=2, dtype=DTYPE)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False, dtype=DTYPE)
        self.out = nn.Linear(24, CLASSES, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu_(self.conv1(x))  # in place after the layer: its δ is still the pre-ReLU gradient
        return self.out(torch.tanh(self.conv2(h)).flatten(1))


class EmbeddingModel(nn.Module):
    """Token embedding (padding row, repeated tokens) summed over 6 positions + an id embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(11, 5, padding_idx=0, dtype=DTYPE)
        self.ids = nn.Embedding(4, 5, dtype=DTYPE)
        self.out = nn.Linear(5, CLASSES, dtype=DTYPE)

    def forward(self, tokens: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.tokens(tokens).sum(1) + self.ids(ids)))


class Mixed(nn.Module):
    """One layer of each kind: Conv2d on [B, 1, 4, 4], Embedding on [B, 3] tokens, Linear on top."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 2, stride=2, dtype=DTYPE)
        self.embed = nn.Embedding(6, 3, dtype=DTYPE)
        self.out = nn.Linear(11, CLASSES, dtype=DTYPE)

    def forward(self, image: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        features = torch.cat([torch.tanh(self.conv(image)).flatten(1), self.embed(tokens).sum(1)], 1)
        return self.out(features)


def make_inputs(kind: str, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Random inputs for the model ``kind``."""
    if kind == "mlp":
        return (torch.randn(batch, 6, generator=generator, dtype=DTYPE),)
    if kind == "sequence":
        return (torch.randn(batch, 3, 9, generator=generator, dtype=DTYPE),)
    if kind == "cnn":
        return (torch.randn(batch, 2, 7, 7, generator=generator, dtype=DTYPE),)
    if kind == "embedding":
        tokens = torch.randint(0, 11, (batch, 6), generator=generator)
        tokens[:, 0], tokens[:, 1] = 0, tokens[:, 2]  # a padding position and a repeated token per row
        return tokens, torch.randint(0, 4, (batch,), generator=generator)
    image = torch.randn(batch, 1, 4, 4, generator=generator, dtype=DTYPE)
    return image, torch.randint(0, 6, (batch, 3), generator=generator)


MODELS = {"mlp": MLP, "sequence": SequenceMLP, "cnn": CNN, "embedding": EmbeddingModel, "mixed": Mixed}


def sum_loss(model: nn.Module, inputs: tuple[torch.Tensor, ...], targets: torch.Tensor) -> torch.Tensor:
    """Σ_i ℓ_i, cross-entropy."""
    return F.cross_entropy(model(*inputs), targets, reduction="sum")


def per_example_gradients(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], targets: torch.Tensor
) -> dict[str, torch.Tensor]:
    """∇_θ ℓ_i for every example (vmap of grad of the one-example loss) → name: [B, *param shape]."""
    params = {n: p.detach() for n, p in model.named_parameters()}

    def one(p: dict, x: tuple, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, p, tuple(t.unsqueeze(0) for t in x))
        return F.cross_entropy(out, y.unsqueeze(0), reduction="sum")

    return vmap(grad(one), in_dims=(None, 0, 0))(params, inputs, targets)


def gradient_matrices(model: nn.Module, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each layer's per-example gradient as a dense matrix [B, n_out, n_in]: Linear [W | b], Conv2d
    [W.view(out, −1) | b], Embedding Wᵀ ([dim, num_embeddings])."""
    out = {}
    for name, module in model.named_modules():
        if not isinstance(module, (nn.Linear, nn.Conv2d, nn.Embedding)):
            continue
        w = grads[f"{name}.weight"]
        if isinstance(module, nn.Embedding):
            out[name] = w.transpose(1, 2)
            continue
        w = w.reshape(w.shape[0], w.shape[1], -1)
        bias = grads.get(f"{name}.bias")
        out[name] = w if bias is None else torch.cat([w, bias.unsqueeze(2)], 2)
    return out


def random_centres(shapes: dict[str, tuple[int, ...]], k: int, generator: torch.Generator) -> dict:
    """K random rank-1 centres per layer for matrices of shape (n_out, n_in)."""
    return {
        n: RankOneCentres(
            torch.randn(k, s[0], generator=generator, dtype=DTYPE),
            torch.randn(k, s[1], generator=generator, dtype=DTYPE),
        )
        for n, s in shapes.items()
    }


def brute_force_distances(matrices: dict[str, torch.Tensor], centres: dict) -> torch.Tensor:
    """Σ_layers ‖d_k c_kᵀ − G_i‖²_F with every matrix formed → [B, K]."""
    total = 0
    for name, g in matrices.items():
        c = centres[name].d.unsqueeze(2) * centres[name].c.unsqueeze(1)  # [K, out, in]
        total = total + (c.unsqueeze(0) - g.unsqueeze(1)).square().sum((2, 3))
    return total


def captured_factors(model: nn.Module, inputs: tuple, targets: torch.Tensor, scale: float = 1.0) -> dict:
    """Factors recorded by LayerCapture over a forward + backward of ``scale · Σ_i ℓ_i``."""
    capture = LayerCapture(scan_layers(model)[0])
    with capture.recording():
        loss = scale * sum_loss(model, inputs, targets)
    loss.backward()
    return capture.factors(grad_scale=scale)


def example_case(kind: str, seed: int) -> tuple:
    """Model ``kind`` (seed 0), 9 random rows and targets, its per-example gradient matrices (torch.func), its
    clusterable layers and the generator (seeded ``seed``) for what the test draws next."""
    torch.manual_seed(0)
    model = MODELS[kind]()
    g = torch.Generator().manual_seed(seed)
    inputs, targets = make_inputs(kind, 9, g), torch.randint(0, CLASSES, (9,), generator=g)
    matrices = gradient_matrices(model, per_example_gradients(model, inputs, targets))
    return model, inputs, targets, matrices, scan_layers(model)[0], g


@pytest.mark.parametrize("kind", list(MODELS))
def test_distances_match_per_example_gradients(kind: str) -> None:
    model, inputs, targets, matrices, layers, g = example_case(kind, 1)
    assert set(layers) == set(matrices)
    for name, module in layers.items():
        assert factor_shape(module) == tuple(matrices[name].shape[1:])
    centres = random_centres({n: m.shape[1:] for n, m in matrices.items()}, 4, g)
    # one centre exactly on an example's gradient where that gradient is rank 1 (distance 0 for that layer)
    if kind == "mlp":
        u, s, vh = torch.linalg.svd(matrices["fc1"][2])
        centres["fc1"].d[0], centres["fc1"].c[0] = u[:, 0] * s[0], vh[0]
    want = brute_force_distances(matrices, centres)
    got = squared_distances(captured_factors(model, inputs, targets), centres)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # the backward of 3·Σℓ with grad_scale=3 gives the same factors
    model.zero_grad()
    scaled = squared_distances(captured_factors(model, inputs, targets, scale=3.0), centres)
    torch.testing.assert_close(scaled, want, rtol=1e-10, atol=1e-10)


def test_both_norm_contractions_are_exercised() -> None:
    """The models above hit the Gram and the dense path of ‖G_i‖², each with and without bias."""
    # (positions, n_in, n_out): SequenceMLP.step1, .step2, CNN.conv1, .conv2, a Linear on [B, in]
    picks = [gram_is_cheaper(*s) for s in [(3, 10, 8), (3, 8, 2), (16, 19, 4), (4, 36, 6), (1, 7, 5)]]
    assert picks == [True, False, False, True, True]


def test_unsupported_layers_are_listed_and_excluded() -> None:
    class Zoo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru = nn.GRU(4, 4)
            self.norm = nn.LayerNorm(4)
            self.grouped = nn.Conv2d(4, 4, 3, groups=2)
            self.same = nn.Conv2d(4, 4, 3, padding="same")
            self.reflect = nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
            self.freq = nn.Embedding(5, 4, scale_grad_by_freq=True)
            self.attn = nn.MultiheadAttention(4, 2)
            self.frozen = nn.Linear(4, 4)
            self.frozen_bias = nn.Linear(4, 3)
            self.ok = nn.Linear(4, 2)
            self.frozen.requires_grad_(False)
            self.frozen_bias.bias.requires_grad_(False)

    zoo = Zoo()
    listed = dict(unsupported_layers(zoo))
    assert set(listed) == {"gru", "norm", "grouped", "same", "reflect", "freq", "attn", "attn.out_proj"}
    assert "groups" in listed["grouped"] and listed["attn.out_proj"].startswith(
        "inside unsupported MultiheadAttention,"
    )
    layers, _ = scan_layers(zoo)
    assert set(layers) == {"frozen_bias", "ok"}
    assert factor_shape(layers["frozen_bias"]) == (3, 4)  # frozen bias: no ones column
    with pytest.warns(UserWarning, match="excludes"):
        gc = GradientClustering(zoo, 2)
    assert gc.layers == ["frozen_bias", "ok"] and dict(gc.excluded) == listed


def test_refusals() -> None:
    model = MLP()
    capture = LayerCapture(scan_layers(model)[0])
    with pytest.raises(RuntimeError, match="twice"), capture.recording():
        model.fc1(model.fc1(torch.zeros(2, 6, dtype=DTYPE))[:, :6])
    capture = LayerCapture(scan_layers(model)[0])
    with capture.recording():
        model(torch.zeros(2, 6, dtype=DTYPE))
    with pytest.raises(RuntimeError, match="run backward"):
        capture.factors()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gc = GradientClustering(model, 2)  # nothing excluded: no warning
    with pytest.raises(RuntimeError, match="before any"):
        gc.update()
    with pytest.raises(ValueError, match="batch mode"):
        GradientClustering(model, 2, mode="batch", decay=0.5)


def test_hooks_record_only_inside_a_capture_and_detach_leaves_the_model_bare() -> None:
    model = MLP()
    gc = GradientClustering(model, 2)
    layers = [model.fc1, model.fc2]
    assert all(not m._forward_hooks for m in layers)  # nothing registered before the first capture
    x = torch.randn(4, 6, dtype=DTYPE)
    with gc.capture():
        model(x).sum().backward()
    assert all(len(m._forward_hooks) == 1 for m in layers)  # registered once, kept after the capture
    model(torch.randn(3, 6, dtype=DTYPE)).sum().backward()  # outside a capture: nothing is recorded
    assert gc._capture._inputs["fc1"] is x  # (a second backward into a recorded layer would raise)
    assert len(gc.after_backward()) == 4  # the captured batch only
    gc.detach()
    assert all(not m._forward_hooks for m in layers)
    with gc.capture():  # attached again
        model(x).sum().backward()
    assert len(gc.after_backward()) == 4


@pytest.mark.parametrize("kind", list(MODELS))
def test_per_step_terms_match_per_example_gradients(kind: str) -> None:
    """The A-step's path (``batch_terms``: one-position Linear layers stacked in one [2, K+1, L, B] buffer with
    their squared norms, the others one by one; mixed in "mixed") gives the brute-force distances, with the
    stacked layers and without, and with a buffer reused from a batch of another size."""
    model, inputs, targets, matrices, layers, g = example_case(kind, 2)
    centres = random_centres({n: m.shape[1:] for n, m in matrices.items()}, 4, g)
    want = brute_force_distances(matrices, centres)
    factors = captured_factors(model, inputs, targets)
    bias = {n: not isinstance(m, nn.Embedding) and has_bias(m) for n, m in layers.items()}
    prepared = {n: PreparedCentres.of(centres[n], bias[n]) for n in layers}
    centre_sq = sum(c.sq_norms() for c in centres.values())
    stacked = stackable(factors, list(layers))
    assert stacked or kind not in ("mlp", "mixed")  # mixed: one stacked Linear among per-layer ones
    buffers = StackedBuffers()
    buffers.prepare(want.new_empty(0), len(stacked) or 1, 5, 4, [True] * (len(stacked) or 1))
    for names in ([], stacked):
        terms = batch_terms(factors, prepared, names, buffers)
        torch.testing.assert_close(
            distances_from(terms.cross, terms.grad_sq, centre_sq), want, rtol=1e-10, atol=1e-10
        )
