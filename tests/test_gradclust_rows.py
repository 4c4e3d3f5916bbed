"""Gradient clustering on losses that are not sums of per-example terms (the pairs task's ranking loss, the
labels task's triplet and margin losses): GC clusters each row's *contribution*, the gradient that flows
through that row's activations, and the contributions sum to the batch gradient (issue #11).

Checked in float64 against contributions computed independently of GC's hooks: one backward of the batch
loss gives ∂L/∂(each row's outputs); each row is then re-encoded alone and that gradient is propagated to
the parameters through the row's own forward (a vector-Jacobian product per row). The sum over rows must be
the batch gradient, and GC's per-row statistics (‖G_i‖², the distances to its centres, the A-step, the
window's distortion) must be those of exactly these contributions.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from raydist.config import load_config
from raydist.data import Vocab
from raydist.distributed import gather_step, step_generator
from raydist.gradclust import GradientClustering, LayerCapture, scan_layers, squared_distances
from raydist.gradclust.centres import PreparedCentres, batch_terms, distances_from, stackable
from raydist.gradclust.layers import has_bias
from raydist.tasks import DataInfo, Encoded, StepContext, Task, build_task
from raydist.train.plan import step_plan

DTYPE = torch.float64
K = 3
WORDS = [
    "<pad>",
    "<start>",
    "<end>",
    "<unk>",
    "a",
    "red",
    "blue",
    "dog",
    "cat",
    "runs",
    "sits",
    "on",
    "the",
    "mat",
]


def labels_case(kind: str, miner: str) -> tuple[Task, dict[str, Tensor]]:
    cfg = load_config(
        "tiny",
        overrides={
            "loss.kind": kind,
            "loss.miner": miner,
            "model.mlp_hidden": [7],
            "model.embed_dim": 5,
            "model.nesting": [],
            "train.batch_size": 10,
            "train.num_workers": 1,
        },
    )
    task = build_task(cfg, DataInfo("labels", feature_dim=6, num_classes=3))
    g = torch.Generator().manual_seed(1)
    batch = {
        "image": torch.randn(10, 6, generator=g, dtype=DTYPE),
        "label": torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0]),
        "sample_id": torch.arange(100, 110),
    }
    return task, batch


def pairs_case(hardest: bool, vocab_dir) -> tuple[Task, dict[str, Tensor]]:
    cfg = load_config(
        "tiny",
        overrides={
            "loss.hardest": hardest,
            "loss.warmup_sh_epochs": 0,
            "model.embed_dim": 5,
            "model.word_dim": 4,
            "train.batch_size": 8,
            "train.num_workers": 1,
        },
    )
    path = vocab_dir / "vocab.json"
    Vocab(WORDS).save(path)
    task = build_task(cfg, DataInfo("pairs", feature_dim=6, files={"vocab.json": path}))
    g = torch.Generator().manual_seed(2)
    lengths = torch.randint(2, 6, (8,), generator=g)
    tokens = torch.randint(4, len(task.tokenizer), (8, 6), generator=g)
    tokens[torch.arange(6) >= lengths.unsqueeze(1)] = 0  # padding after each caption
    batch = {
        # 2 captions per image, each row's copy of the image nudged apart: with exact copies, an MH query's
        # hardest negative ties between them, and which copy torch.max picks (so which row the contribution
        # is attributed to) depends on the CPU's kernels
        "image": torch.randn(8, 6, generator=g, dtype=DTYPE).repeat_interleave(2, 0)[:8]
        + 1e-3 * torch.randn(8, 6, generator=g, dtype=DTYPE),
        "tokens": tokens,
        "lengths": lengths,
        "image_id": torch.arange(8) // 2,
        "sample_id": torch.arange(8),
    }
    return task, batch


def row_outputs(encoded: Encoded) -> list[Tensor]:
    """The tensors with one row per example that the loss sees (embeddings, and the labels task's logits)."""
    outs = list(encoded.embeddings.values())
    if isinstance(encoded.extras.get("logits"), Tensor):
        outs.append(encoded.extras["logits"])
    return outs


def step_loss(task: Task, encoded: Encoded) -> Tensor:
    """The training step's loss (raydist/train/loop.py train_step) at W = 1, kept in float64."""
    cfg = task.cfg
    gathered = gather_step(encoded.embeddings, encoded.ids, enabled=cfg.loss.gather and task.gathers)
    negative_set = step_plan(cfg, task.info.task).draw(0, step_generator(cfg.train.seed, 0))
    return task.loss(encoded, gathered, negative_set, StepContext(0, 0, 0, 1), {})


def layer_matrix(module: nn.Module, grads: dict[str, Tensor], name: str) -> Tensor:
    """A clustered layer's gradient as GC's matrix: Linear ``[W | b]``, Embedding ``Wᵀ``."""
    w = grads[f"{name}.weight"]
    if isinstance(module, nn.Embedding):
        return w.T
    return torch.cat([w, grads[f"{name}.bias"].unsqueeze(1)], 1) if has_bias(module) else w


@pytest.fixture(params=["triplet-all", "margin-hardest", "pairs-MH", "pairs-SH"])
def case(request, tmp_path):
    kind, variant = request.param.split("-")
    if kind == "pairs":
        return pairs_case(variant == "MH", tmp_path)
    return labels_case(kind, variant)


def test_row_contributions_sum_to_the_batch_gradient_and_are_what_gc_clusters(case) -> None:
    task, batch = case
    assert not task.per_example_losses and task.row_loss_scale(len(batch["sample_id"])) == 1.0
    torch.manual_seed(0)
    model = task.build_model().to(DTYPE)
    params = dict(model.named_parameters())
    rows = len(batch["sample_id"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pairs: the GRU, margin: β are excluded (listed in gc.excluded)
        gc = GradientClustering(model, K, update_every=10**6)
    layers = scan_layers(model)[0]
    reference = LayerCapture(layers)

    # the batch: one backward of the training loss, GC's hooks recording
    with gc.capture(), reference.recording():
        encoded = task.encode(model, batch)
    outs = row_outputs(encoded)
    for out in outs:
        out.retain_grad()
    loss = step_loss(task, encoded)
    assert loss.dtype == DTYPE and float(loss.detach()) > 0
    loss.backward()
    assignment = gc.after_backward(batch["sample_id"], loss_scale=task.row_loss_scale(rows))
    factors = reference.factors(task.row_loss_scale(rows))

    # each row alone: ∂L/∂(its outputs) through its own forward, to every parameter
    contributions = {n: torch.zeros(rows, *p.shape, dtype=DTYPE) for n, p in params.items()}
    for r in range(rows):
        own = row_outputs(task.encode(model, {k: v[r : r + 1] for k, v in batch.items()}))
        grads = torch.autograd.grad(
            own, list(params.values()), [o.grad[r : r + 1] for o in outs], allow_unused=True
        )
        for (name, _), grad in zip(params.items(), grads, strict=False):
            if grad is not None:
                contributions[name][r] = grad

    # the sum identity, for every parameter reached through the rows (β of the margin loss is not)
    for name, p in params.items():
        if name.startswith("beta."):
            assert contributions[name].abs().max() == 0 and any(n == "beta" for n, _ in gc.excluded)
            continue
        torch.testing.assert_close(contributions[name].sum(0), p.grad, rtol=1e-10, atol=1e-12)
    assert any(contributions[f"{n}.weight"].abs().max() > 0 for n in layers)

    # GC's per-row statistics are those of the contributions
    matrices = {
        n: torch.stack([layer_matrix(m, {k: v[r] for k, v in contributions.items()}, n) for r in range(rows)])
        for n, m in layers.items()
    }
    want_sq = sum(m.square().sum((1, 2)) for m in matrices.values())
    torch.testing.assert_close(sum(factors[n].sq_norms() for n in layers), want_sq, rtol=1e-10, atol=1e-14)
    centres = gc.centres
    want = sum(
        (centres[n].d[:, :, None] * centres[n].c[:, None, :] - matrices[n][:, None]).square().sum((2, 3))
        for n in layers
    )
    torch.testing.assert_close(squared_distances(factors, centres), want, rtol=1e-9, atol=1e-12)
    prepared = {n: PreparedCentres.of(centres[n], gc._bias[n]) for n in layers}
    centre_sq = sum(c.sq_norms() for c in centres.values())
    stacked = stackable(factors, list(layers))
    assert (
        stacked
    )  # the per-step path stacks this model's one-position layers; check it and the per-layer one
    for names in ([], stacked):
        terms = batch_terms(factors, prepared, names)
        got = distances_from(terms.cross, terms.grad_sq, centre_sq)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    # the A-step (no counts yet: plain nearest centre) and the window's distortion D_k
    assert torch.equal(assignment, want.argmin(1))
    window = gc.state_dict()["window"]
    nearest = want.min(1).values.numpy()
    np.testing.assert_allclose(window["counts"].numpy(), np.bincount(assignment.numpy(), minlength=K))
    np.testing.assert_allclose(
        window["distortion"].numpy(),
        np.bincount(assignment.numpy(), weights=nearest, minlength=K),
        rtol=1e-9,
        atol=1e-12,
    )


def test_local_loss_with_row_weights_gives_the_weighted_sum_of_contributions(case) -> None:
    """``Task.local_loss(..., row_weights=w)`` (the reassignment pass's and the variance meter's loss, and
    through ``Encoded.weighted`` the loss of GC-sampled training batches) has the unweighted loss's value and
    the gradient ``Σ_i w_i c_i`` of the contributions computed row by row as above."""
    task, batch = case
    torch.manual_seed(0)
    model = task.build_model().to(DTYPE)
    params = dict(model.named_parameters())
    rows = len(batch["sample_id"])
    ctx = StepContext(0, 0, 0, 1)
    encoded = task.encode(model, batch)
    outs = row_outputs(encoded)
    for out in outs:
        out.retain_grad()
    plain = step_loss(task, encoded)
    plain.backward()
    weights = torch.linspace(0.25, 3.0, rows, dtype=DTYPE)
    want = {n: torch.zeros_like(p) for n, p in params.items()}
    for r in range(rows):
        own = row_outputs(task.encode(model, {k: v[r : r + 1] for k, v in batch.items()}))
        grads = torch.autograd.grad(
            own, list(params.values()), [o.grad[r : r + 1] for o in outs], allow_unused=True
        )
        for name, grad in zip(params, grads, strict=False):
            if grad is not None:
                want[name] += weights[r] * grad
    model.zero_grad(set_to_none=True)
    weighted = task.local_loss(model, batch, ctx, row_weights=weights)
    torch.testing.assert_close(weighted.detach(), plain.detach(), rtol=1e-12, atol=0)
    weighted.backward()
    for name, p in params.items():
        if name.startswith("beta."):  # the margin loss's β is a parameter of the loss, not of any row
            continue
        torch.testing.assert_close(p.grad, want[name], rtol=1e-10, atol=1e-12)


def test_local_loss_of_cross_entropy_with_weights_is_the_weighted_mean() -> None:
    """The thesis setting: for a mean of per-example losses, weighting the rows' contributions is exactly the
    gradient of ``Σ_i w_i ℓ_i / B`` (the stratified estimator), checked against per-example cross-entropy."""
    task, batch = labels_case("cross_entropy", "semihard-random")
    torch.manual_seed(0)
    model = task.build_model().to(DTYPE)
    weights = torch.linspace(0.5, 2.0, len(batch["sample_id"]), dtype=DTYPE)
    _, logits = model(batch["image"])
    # the head's cross-entropy runs in float32 (as in training), so the reference does too
    per_row = torch.nn.functional.cross_entropy(logits.float(), batch["label"], reduction="none")
    want = torch.autograd.grad((weights.float() * per_row).mean(), list(model.parameters()))
    got = torch.autograd.grad(
        task.local_loss(model, batch, StepContext(0, 0, 0, 1), row_weights=weights), list(model.parameters())
    )
    for g, w in zip(got, want, strict=False):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-9)
