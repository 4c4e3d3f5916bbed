"""Gradient clustering over a model whose caption side is the transformer text encoder: the captured factors
of its Linear and Embedding layers (feed-forward, projection, token and position embeddings) against per-example
gradients from torch.func (vmap of grad), float64, on padded captions of different lengths; padding contributes
nothing; attention and LayerNorm are listed as excluded; the eval-mode fast path never hides a layer from a
capture; an in-process run with gc.measure and Matryoshka nesting completes."""

from __future__ import annotations

import pytest
import torch
from test_gradclust_layers import brute_force_distances, gradient_matrices, random_centres
from torch import nn
from torch.func import functional_call, grad, vmap

from raydist.config import load_config
from raydist.gradclust import (
    GradientClustering,
    LayerCapture,
    scan_layers,
    squared_distances,
    unsupported_layers,
)
from raydist.gradclust.layers import factor_shape
from raydist.models import build_model
from raydist.train.plan import prepare_run
from raydist.train.trainer import train_in_process

DTYPE = torch.float64
VOCAB, MAX_LEN, PAD, FEATURES = 30, 10, 0, 6
LENGTHS = [2, MAX_LEN, 5, 7, 3, 9, 1]

# torch.func has no batching rule for the CPU flash-attention kernel and falls back to a loop: slower, exact
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


def _model(pooling: str = "mean") -> nn.Module:
    """The project's VSE model (linear image side) with a 2-layer transformer caption encoder, no dropout."""
    cfg = load_config(
        "tiny",
        overrides={
            "model.text_encoder": "transformer",
            "model.text_layers": 2,
            "model.text_heads": 2,
            "model.text_width": 16,
            "model.text_dropout": 0.0,
            "model.text_pooling": pooling,
            "model.embed_dim": 8,
            "data.max_caption_len": MAX_LEN,
        },
    )
    torch.manual_seed(0)
    return build_model(cfg, FEATURES, VOCAB, pad_id=PAD).to(DTYPE)


def _batch(padding: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features [B, FEATURES], right-padded token ids [B, MAX_LEN] and lengths [B]; the padding holds the pad id
    or (``random``) real ids, which a layer that saw padding would pick up."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor(LENGTHS)
    tokens = torch.randint(1, VOCAB, (len(LENGTHS), MAX_LEN), generator=g)
    if padding == "pad":
        tokens[torch.arange(MAX_LEN)[None] >= lengths[:, None]] = PAD
    return torch.randn(len(LENGTHS), FEATURES, generator=g, dtype=DTYPE), tokens, lengths


def _losses(
    model: nn.Module, features: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """ℓ_i = ‖f(x_i) − g(c_i)‖², one independent term per example."""
    image, text = model(features, tokens, lengths)
    return (image - text).square().sum(1)


def _per_example_gradients(model: nn.Module, batch: tuple) -> dict[str, torch.Tensor]:
    """∇_θ ℓ_i for every example: vmap of grad of the one-example loss (each example still padded)."""
    params = {n: p.detach() for n, p in model.named_parameters()}

    def one(p: dict, features: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        image, text = functional_call(model, p, (features[None], tokens[None], lengths[None]))
        return (image - text).square().sum()

    return vmap(grad(one), in_dims=(None, 0, 0, 0))(params, *batch)


def _captured(model: nn.Module, batch: tuple) -> dict:
    capture = LayerCapture(scan_layers(model)[0])
    with capture.recording():
        loss = _losses(model, *batch).sum()
    loss.backward()
    model.zero_grad()
    return capture.factors()


@pytest.mark.parametrize("pooling", ["mean", "cls"])
@pytest.mark.parametrize("padding", ["pad", "random"])
def test_statistics_match_per_example_gradients_on_padded_captions(pooling: str, padding: str) -> None:
    model = _model(pooling)
    batch = _batch(padding)
    layers, _ = scan_layers(model)
    blocks = [f"text.encoder.layers.{i}.{n}" for i in range(2) for n in ("linear1", "linear2")]
    assert set(layers) == {"image.fc", "text.embed", "text.positions", "text.proj", *blocks}
    grads = _per_example_gradients(model, batch)
    matrices = {n: g for n, g in gradient_matrices(model, grads).items() if n in layers}
    for name, module in layers.items():
        assert factor_shape(module) == tuple(matrices[name].shape[1:])
    factors = _captured(model, batch)
    # padded positions contribute nothing: their output gradient δ is exactly zero in every token-wise layer
    padded = torch.arange(MAX_LEN)[None] >= torch.tensor(LENGTHS)[:, None]
    for name in ["text.embed", "text.positions", *blocks]:
        assert factors[name].grads.shape[1] == MAX_LEN
        assert torch.count_nonzero(factors[name].grads[padded]) == 0, name
    for name, factor in factors.items():
        torch.testing.assert_close(
            factor.sq_norms(), matrices[name].square().sum((1, 2)), rtol=1e-10, atol=1e-12
        )
    g = torch.Generator().manual_seed(2)
    centres = random_centres({n: m.shape[1:] for n, m in matrices.items()}, 3, g)
    want = brute_force_distances(matrices, centres)
    torch.testing.assert_close(squared_distances(factors, centres), want, rtol=1e-10, atol=1e-10)


def test_reference_gradients_do_not_depend_on_padding() -> None:
    """The vmap reference on padded captions equals each caption's gradient computed alone, unpadded."""
    model = _model()
    features, tokens, lengths = _batch("random")
    grads = _per_example_gradients(model, (features, tokens, lengths))
    params = dict(model.named_parameters())
    for i, n in enumerate(LENGTHS):
        loss = _losses(model, features[i : i + 1], tokens[i : i + 1, :n], lengths[i : i + 1]).sum()
        alone = torch.autograd.grad(loss, list(params.values()))
        for (name, _), want in zip(params.items(), alone, strict=False):
            torch.testing.assert_close(
                grads[name][i], want, rtol=1e-9, atol=1e-12, msg=f"{name}, caption {i}"
            )


def test_attention_and_layer_norm_are_listed_as_excluded() -> None:
    listed = dict(unsupported_layers(_model()))
    prefix = "text.encoder.layers"
    attention = {f"{prefix}.{i}.self_attn" for i in range(2)}
    norms = {f"{prefix}.{i}.norm{j}" for i in range(2) for j in (1, 2)} | {"text.encoder.norm"}
    assert set(listed) == attention | {f"{a}.out_proj" for a in attention} | norms
    assert all(
        listed[a].startswith("attention: in_proj_weight and out_proj are applied functionally")
        for a in attention
    )
    assert all(listed[f"{a}.out_proj"].startswith("inside unsupported MultiheadAttention") for a in attention)
    assert all(listed[n].startswith("LayerNorm: an elementwise scale and shift") for n in norms)


def test_eval_mode_capture_takes_the_module_path() -> None:
    """In eval mode TransformerEncoderLayer may run a fused kernel that skips its Linear modules; a capture
    runs with gradients on and hooks attached, so it never does: the same factors as in train mode."""
    model = _model()
    batch = _batch("pad")
    want = {n: f.sq_norms() for n, f in _captured(model, batch).items()}
    with pytest.warns(UserWarning, match="excludes"):
        gc = GradientClustering(model.eval(), 2)
    with gc.capture():
        loss = _losses(model, *batch).sum()
    torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    got = gc._capture.factors()
    assert set(got) == set(want)
    for name, norms in want.items():
        torch.testing.assert_close(got[name].sq_norms(), norms, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # an eval forward outside a capture (hooks attached) records nothing
        model(*batch)
    assert not gc._capture._inputs


@pytest.mark.timeout(300)
def test_measure_runs_in_process_with_nesting(tiny_dataset, tmp_path, capsys) -> None:
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(tiny_dataset),
            "train.num_workers": 0,
            "train.epochs": 1,
            "train.storage_path": str(tmp_path / "runs"),
            "data.train_fraction": 0.1,
            "data.max_caption_len": 16,
            "model.text_encoder": "transformer",
            "model.text_layers": 1,
            "model.text_heads": 2,
            "model.text_width": 32,
            "model.nesting": [16, 64],
            "gc.measure": True,
            "gc.num_clusters": 4,
            "gc.reassign_every": 1,
            "gc.log_every": 5,
            "gc.variance_batches": 2,
        },
    )
    outcome = train_in_process(prepare_run(cfg))
    last = outcome.history[-1]
    for key in ("gvar/sgd_var", "gvar/gc_var", "gc/distortion", "val/min_dim_rsum"):
        assert key in last and last[key] > 0, key
    [line] = [x for x in capsys.readouterr().out.splitlines() if "gradient clustering over" in x]
    assert "over 6 layers" in line  # image.fc, text.embed, text.positions, linear1, linear2, text.proj
    for name in ("text.encoder.layers.0.self_attn", "text.encoder.layers.0.norm1", "text.encoder.norm"):
        assert name in line
    assert line.count("(LayerNorm: ") == 1  # one reason once, after all the modules it applies to
