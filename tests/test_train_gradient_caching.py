"""Gradient caching (raydist/train/gradient_caching.py, ``train.grad_cache_chunk``): the parameter gradients of a cached
training step equal those of one backward through the whole batch's graph.

The reference is computed here with plain autograd: the encoders run over the batch in the same chunks *with*
a graph (from the same RNG state, so dropout and in-model augmentation draw what the cached step's first pass
draws), the task's gather / draw / loss run on the concatenation, one backward, gradients averaged over the
workers by hand. With one chunk of the whole batch that is exactly the uncached training step, which is checked
too (``train_step`` with ``grad_cache_chunk=0``). 2 gloo processes, float64, 7 rows per worker (chunks of 3
leave a ragged last chunk), cross-worker MH negatives with an image id shared across the workers; cases: a
small CNN with random augmentation inside the model, the GRU (inter-layer dropout) and the transformer
(dropout) text encoders, SigLIP (Matryoshka nesting, learnable scale and bias), and the labels task's triplet (Matryoshka nesting, random semi-hard miner) and margin
(learnable per-class β, distance-weighted miner) losses. End to end: two seeded 2-worker Ray runs on PNG images,
chunk 16 vs off, log the same per-step losses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from raydist.config import ConfigError, load_config
from raydist.data import Vocab
from raydist.distributed import StepPlan, all_gather_tensor, gather_step, step_generator
from raydist.distributed.spawn import spawn
from raydist.models import image_encoders, unwrap_model
from raydist.models.image_encoders import Backbone, register_image_encoder
from raydist.tasks import DataInfo, Encoded, StepContext, build_task
from raydist.train.gradient_caching import check_grad_cache, check_model
from raydist.train.hooks import Hook
from raydist.train.loop import Trainables, train_step

WORLD, ROWS, FEATURES, SIDE, MAX_LEN, CLASSES = 2, 7, 6, 10, 9, 3
CHUNKS = (1, 3, ROWS)
WORDS = [f"w{i}" for i in range(20)]
# case → (task, config overrides); every case trains float64 on CPU
CASES = {
    "small-cnn-augmented": (
        "pairs",
        {
            "model.image_encoder": "small-cnn",
            "model.cnn_width": 8,
            "model.cnn_depth": 2,
            "data.image_size": SIDE,
        },
    ),
    "gru-dropout": ("pairs", {"model.num_layers": 2}),
    "transformer-dropout": (
        "pairs",
        {
            "model.text_encoder": "transformer",
            "model.text_layers": 2,
            "model.text_heads": 2,
            "model.text_width": 8,
            "model.text_dropout": 0.3,
        },
    ),
    "siglip-nested": ("pairs", {"loss.kind": "siglip", "model.nesting": [2, 4], "loss.bias_init": -1.0}),
    "labels-triplet-nested": (
        "labels",
        {
            "loss.kind": "triplet",
            "loss.miner": "semihard-random",
            "model.nesting": [2, 4],
            "model.mlp_hidden": [8],
        },
    ),
    "labels-margin-beta": (
        "labels",
        {"loss.kind": "margin", "loss.miner": "distance-weighted", "loss.beta_per_class": True},
    ),
}
RANDOM_FORWARD = {
    "small-cnn-augmented",
    "gru-dropout",
    "transformer-dropout",
}  # the forward draws from the RNG


class RandomShiftFlipNoise(nn.Module):
    """Augmentation inside the model (as GPU pipelines do it), drawn from the torch RNG in training mode: a
    random left-right flip per image, a random shift of up to one pixel, Gaussian noise."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        flip = torch.rand(x.shape[0], device=x.device) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        dy, dx = torch.randint(-1, 2, (2,)).tolist()
        return torch.roll(x, (dy, dx), (-2, -1)) + 0.1 * torch.randn_like(x)


def make_task(case: str, folder: Path, **extra: object):
    """The case's config (2 workers, global batch 14, MH from the first step; ``extra``: more overrides) and
    task."""
    kind, overrides = CASES[case]
    overrides = {**overrides, **extra}
    cfg = load_config(
        "tiny",
        overrides={
            "train.batch_size": WORLD * ROWS,
            "model.embed_dim": 4,
            "model.word_dim": 5,
            "data.max_caption_len": MAX_LEN,
            "loss.warmup_sh_epochs": 0,
            "train.seed": 5,
            **overrides,
        },
        task_of=lambda _: kind,
    )
    if kind == "labels":
        info = DataInfo("labels", FEATURES, num_classes=CLASSES)
    else:
        vocab = folder / "vocab.json"
        if not vocab.exists():
            Vocab.build(" ".join(WORDS) for _ in range(1)).save(vocab)
        encoded = case == "small-cnn-augmented"
        info = DataInfo(
            "pairs",
            None if encoded else FEATURES,
            files={"vocab.json": vocab},
            image_format="encoded" if encoded else "features",
            image_channels=3 if encoded else None,
            image_size=(SIDE, SIDE) if encoded else None,
        )
    return cfg, build_task(cfg, info)


def make_model(case: str, task) -> nn.Module:
    """The task's model in float64 (same weights for the same case), with the case's randomness switched on."""
    torch.manual_seed(0)
    model = task.build_model()
    if case == "small-cnn-augmented":
        model.image = nn.Sequential(RandomShiftFlipNoise(), model.image)
    if case == "gru-dropout":
        model.text.rnn.dropout = 0.3  # nn.GRU's dropout between its two layers (the shipped GRU has none)
    return model.double()


def make_bank(case: str, vocab_size: int) -> dict[str, np.ndarray]:
    """Both workers' rows (rank r holds rows r·ROWS …): pairs with image id 2 on both ranks (rows 2 and 9:
    never each other's negatives), or labelled vectors of 3 classes."""
    g = np.random.default_rng(11)
    n = WORLD * ROWS
    if CASES[case][0] == "labels":
        return {
            "image": g.normal(size=(n, FEATURES)),
            "label": np.arange(n) % CLASSES,
            "sample_id": np.arange(100, 100 + n),
        }
    lengths = g.integers(2, MAX_LEN + 1, n)
    tokens = g.integers(4, vocab_size, (n, MAX_LEN))
    tokens[np.arange(MAX_LEN)[None] >= lengths[:, None]] = 0
    shape = (3, SIDE, SIDE) if case == "small-cnn-augmented" else (FEATURES,)
    image_ids = np.arange(n)
    image_ids[ROWS + 2] = 2
    return {
        "image": g.normal(size=(n, *shape)),
        "tokens": tokens,
        "lengths": lengths,
        "image_id": image_ids,
        "sample_id": np.arange(100, 100 + n),
    }


class KeepGrads(Hook):
    """Copies the parameter gradients after backward (before clipping and the optimizer step)."""

    def after_backward(self, ctx: StepContext, model: nn.Module) -> None:
        self.grads = {n: p.grad.detach().clone() for n, p in unwrap_model(model).named_parameters()}


def step_grads(
    cfg, task, model: nn.Module, batch, chunk: int, rank: int, world: int, loss_scale: float | None = None
) -> dict[str, torch.Tensor]:
    """The parameter gradients of one ``train_step`` with ``train.grad_cache_chunk=chunk`` (``loss_scale``: the
    fp16 GradScaler's initial scale instead of its default 2^16)."""
    cfg = cfg.model_copy(deep=True)
    cfg.train.grad_cache_chunk = chunk
    parts = Trainables.build(cfg, model, torch.device("cpu"))
    if loss_scale is not None:
        parts.scaler = torch.amp.GradScaler("cpu", init_scale=loss_scale)
    keep = KeepGrads()
    torch.manual_seed(100 + rank)  # the step's RNG: dropout, in-model augmentation
    plan = StepPlan(cfg.train.batch_size, None, world)
    ctx = StepContext(0, 0, rank, world)
    train_step(parts, task, batch, cfg, plan, ctx, torch.device("cpu"), {}, [keep])
    return keep.grads


def reference_grads(cfg, task, model: nn.Module, batch, chunk: int, rank: int, world: int):
    """Plain autograd: the encoders over ``chunk``-row slices with a graph from the same RNG state, the step's
    gather, draw and loss on the concatenation, one backward, the gradients averaged over the workers."""
    tensors = {k: torch.as_tensor(v) for k, v in batch.items()}
    torch.manual_seed(100 + rank)
    parts = [
        task.encode(model, {k: v[s : s + chunk] for k, v in tensors.items()}) for s in range(0, ROWS, chunk)
    ]
    extras = dict(parts[0].extras)
    logits = extras.get("logits")
    if isinstance(logits, list):  # Matryoshka: one per nested dim
        extras["logits"] = [torch.cat(z) for z in zip(*(p.extras["logits"] for p in parts), strict=False)]
    elif logits is not None:
        extras["logits"] = torch.cat([p.extras["logits"] for p in parts])
    encoded = Encoded(
        {k: torch.cat([p.embeddings[k] for p in parts]) for k in parts[0].embeddings},
        {k: torch.cat([p.ids[k] for p in parts]) for k in parts[0].ids},
        extras,
    )
    gathered = gather_step(encoded.embeddings, encoded.ids, enabled=cfg.loss.gather and task.gathers)
    plan = StepPlan(cfg.train.batch_size, None, world)
    negative_set = plan.draw(rank, step_generator(cfg.train.seed, 0))
    loss = task.loss(encoded, gathered, negative_set, StepContext(0, 0, rank, world), {})
    names, params = zip(*model.named_parameters(), strict=False)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    out = {}
    for name, p, g in zip(names, params, grads, strict=False):
        g = torch.zeros_like(p) if g is None else g
        out[name] = all_gather_tensor(g[None]).mean(0) if world > 1 else g
    return out


def all_grads(case: str, folder: Path, rank: int, world: int, state: dict) -> dict:
    """On this rank: the uncached step's gradients, the cached step's and the reference's for every chunk."""
    cfg, task = make_task(case, folder)
    bank = make_bank(case, len(task.tokenizer) if hasattr(task, "tokenizer") else 0)
    batch = {k: v[rank * ROWS : (rank + 1) * ROWS] for k, v in bank.items()}

    def fresh(ddp: bool) -> nn.Module:
        model = make_model(case, task)
        model.load_state_dict(state)
        return DistributedDataParallel(model) if ddp else model

    out = {"uncached": step_grads(cfg, task, fresh(world > 1), batch, 0, rank, world)}
    for chunk in CHUNKS:
        out[f"cached{chunk}"] = step_grads(cfg, task, fresh(world > 1), batch, chunk, rank, world)
        out[f"reference{chunk}"] = reference_grads(cfg, task, fresh(False), batch, chunk, rank, world)
    return out


def _worker(rank: int, init_file: str, folder: str, states: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    results = {case: all_grads(case, Path(folder), rank, WORLD, states[case]) for case in CASES}
    torch.save(results, Path(folder) / f"rank{rank}.pt")
    dist.destroy_process_group()


def assert_same(got: dict, want: dict, what: str) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(
            got[name], value, rtol=0, atol=1e-10, msg=lambda m, n=name: f"{what} {n}: {m}"
        )


def check_case(case: str, grads: dict) -> None:
    """The cached step's gradients equal the reference's for every chunk, the one-chunk reference is the
    uncached step, and (a forward that draws from the RNG) the chunking changes the draws."""
    assert_same(grads[f"reference{ROWS}"], grads["uncached"], f"{case}: one-chunk reference vs uncached step")
    for chunk in CHUNKS:
        assert_same(grads[f"cached{chunk}"], grads[f"reference{chunk}"], f"{case}: chunk {chunk}")
        if case not in RANDOM_FORWARD:
            assert_same(grads[f"cached{chunk}"], grads["uncached"], f"{case}: chunk {chunk} vs uncached")
    assert max(g.abs().max() for g in grads["uncached"].values()) > 1e-3
    if case in RANDOM_FORWARD:  # dropout / augmentation are on: other chunks draw other numbers
        gap = max((grads["reference1"][n] - grads["uncached"][n]).abs().max() for n in grads["uncached"])
        assert gap > 1e-6, case


@pytest.mark.slow
@pytest.mark.gloo
@pytest.mark.timeout(240)
def test_cached_gradients_equal_uncached_over_two_gloo_workers(tmp_path):
    states = {}
    for case in CASES:
        _, task = make_task(case, tmp_path)
        states[case] = make_model(case, task).state_dict()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spawn(_worker, (str(tmp_path / "init"), str(tmp_path), states), nprocs=WORLD)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for case in CASES:
        for grads in ranks:
            check_case(case, grads[case])
        assert_same(ranks[1][case]["cached3"], ranks[0][case]["cached3"], f"{case}: rank 1 vs rank 0")


@pytest.mark.parametrize("case", ["transformer-dropout", "labels-margin-beta", "siglip-nested"])
def test_one_process_cached_gradients_equal_the_reference(tmp_path, case):
    cfg, task = make_task(case, tmp_path)
    cfg.train.batch_size = ROWS
    bank = make_bank(case, len(task.tokenizer) if hasattr(task, "tokenizer") else 0)
    batch = {k: v[:ROWS] for k, v in bank.items()}
    state = make_model(case, task).state_dict()

    def fresh() -> nn.Module:
        model = make_model(case, task)
        model.load_state_dict(state)
        return model

    grads = {"uncached": step_grads(cfg, task, fresh(), batch, 0, 0, 1)}
    for chunk in CHUNKS:
        grads[f"cached{chunk}"] = step_grads(cfg, task, fresh(), batch, chunk, 0, 1)
        grads[f"reference{chunk}"] = reference_grads(cfg, task, fresh(), batch, chunk, 0, 1)
    check_case(case, grads)


def test_the_rng_is_left_as_the_uncached_step_leaves_it_with_one_chunk(tmp_path):
    """Replaying restores the state each chunk started from, then the state after the loss: with the whole
    batch as one chunk the next draw is the uncached step's."""
    cfg, task = make_task("transformer-dropout", tmp_path)
    cfg.train.batch_size = ROWS
    batch = {k: v[:ROWS] for k, v in make_bank("transformer-dropout", len(task.tokenizer)).items()}
    state = make_model("transformer-dropout", task).state_dict()
    after = []
    for chunk in (0, ROWS):
        model = make_model("transformer-dropout", task)
        model.load_state_dict(state)
        step_grads(cfg, task, model, batch, chunk, 0, 1)
        after.append(torch.rand(3))
    torch.testing.assert_close(after[0], after[1], rtol=0, atol=0)


@pytest.fixture
def batchnorm_encoder(monkeypatch):
    """An image encoder with BatchNorm, ``test-batchnorm``, registered for one test (the registry is restored)."""
    monkeypatch.setattr(image_encoders._REGISTRY, "_entries", dict(image_encoders._REGISTRY._entries))

    @register_image_encoder("test-batchnorm")
    def _batchnorm_encoder(*, in_dim, channels: int, image_size) -> Backbone:
        net = nn.Sequential(
            nn.Conv2d(channels, 4, 3), nn.BatchNorm2d(4), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )
        return Backbone(net, 4)


def test_batchnorm_gc_and_forward_hooks_are_refused_with_the_reason(tmp_path, batchnorm_encoder):
    info = DataInfo("pairs", None, image_format="encoded", image_channels=3, image_size=(SIDE, SIDE))
    cfg = load_config(
        "tiny",
        overrides={
            "model.image_encoder": "test-batchnorm",
            "train.grad_cache_chunk": 4,
            "data.image_size": 8,
        },
    )
    with pytest.raises(
        ConfigError, match=r"grad_cache_chunk=4 with model.image_encoder=test-batchnorm: .*BatchNorm2d"
    ):
        check_grad_cache(cfg, info)
    check_grad_cache(
        cfg.model_copy(update={"train": cfg.train.model_copy(update={"grad_cache_chunk": 0})}), info
    )
    small = load_config("tiny", overrides={"model.image_encoder": "small-cnn", "train.grad_cache_chunk": 4})
    check_grad_cache(small, info)  # GroupNorm: accepted
    with pytest.raises(
        ConfigError, match=r"grad_cache_chunk=2 with gc.measure/gc.sample: gradient clustering"
    ):
        load_config("tiny", overrides={"train.grad_cache_chunk": 2, "gc.measure": True})
    # in the workers: a model with BatchNorm in training mode, a hook that wraps the forward pass
    net = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    with pytest.raises(ConfigError, match=r"grad_cache_chunk=3 is refused: 1 \(BatchNorm1d\)"):
        check_model(net, [], 3)
    check_model(net.eval(), [], 3)

    class Wraps(Hook):
        def forward_context(self, ctx):
            return super().forward_context(ctx)

    with pytest.raises(ConfigError, match="hook Wraps wraps the forward pass"):
        check_model(nn.Linear(2, 2), [Wraps(), KeepGrads()], 3)


@pytest.fixture(scope="module")
def shape_pairs(tmp_path_factory):
    """An encoded pairs dataset of 16×16 PNG shapes (tests/test_tasks_images.py): 180 train images."""
    from test_tasks_images import write_shape_pairs

    return write_shape_pairs(
        tmp_path_factory.mktemp("grad-cache-shapes"),
        per_class={"train": 20, "val": 3, "test": 3},
        rows_per_shard=60,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ray_workers_log_the_same_losses_with_and_without_caching(ray_cluster, shape_pairs, tmp_path):
    """2 Ray Train workers on PNG images (small CNN, random crops and flips, MH across the workers),
    global batch 48 (24 rows per worker: chunks of 16 and 8): the same seeded run with train.grad_cache_chunk=16
    and off logs the same loss at every step."""
    from raydist.runfiles import STEPS_FILE
    from raydist.train.trainer import run_training

    losses = {}
    for chunk in (0, 16):
        cfg = load_config(
            "tiny",
            overrides={
                "data.path": str(shape_pairs),
                "model.image_encoder": "small-cnn",
                "model.cnn_width": 8,
                "train.batch_size": 48,
                "train.epochs": 1,
                "loss.warmup_sh_epochs": 0,
                "train.log_every": 1,
                "train.grad_cache_chunk": chunk,
                "train.storage_path": str(tmp_path / f"chunk{chunk}"),
            },
        )
        outcome = run_training(cfg, evaluate_test=False)
        lines = (Path(outcome.run_dir) / STEPS_FILE).read_text().splitlines()
        losses[chunk] = [json.loads(line)["loss"] for line in lines]
    assert len(losses[0]) == 3, losses  # 180 // 48 steps
    print(f"per-step losses, off: {losses[0]}\nchunk 16: {losses[16]}")
    assert losses[16] == pytest.approx(losses[0], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_and_clipping_keep_working(tmp_path, amp):
    """float32 model under autocast (fp16: with the GradScaler's loss scale) and a clip that binds: the cached
    step's (scaled) gradients and its updated parameters equal the uncached step's, with one chunk exactly
    (the same forward); with chunks of 3 the cached step stays within half-precision rounding of the float32
    gradient (10 %: 8 mantissa bits through a width-8 transformer). SH, not MH: a forward of 3 rows rounds
    differently from one of 7, which can flip a near-tied hardest negative (a different gradient, not a
    rounding error; seen with bf16 on AVX2-only CPUs, where 3-row chunks landed 29 % off with MH, 6 % with
    SH, and the uncached bf16 step 2 %)."""
    cfg, task = make_task("transformer-dropout", tmp_path, **{"loss.hardest": False})
    cfg.train.batch_size, cfg.train.amp, cfg.train.grad_clip = ROWS, amp, 0.05
    cfg.model.text_dropout = 0.0
    batch = {
        k: v[:ROWS].astype(np.float32) if v.dtype == np.float64 else v[:ROWS]
        for k, v in make_bank("transformer-dropout", len(task.tokenizer)).items()
    }
    torch.manual_seed(0)
    state = task.build_model().state_dict()
    scale = 2.0**8 if amp == "fp16" else 1.0  # fp16: a loss scale whose gradients stay finite
    out = {}
    for chunk in (0, ROWS, 3):
        model = task.build_model()
        model.load_state_dict(state)
        grads = step_grads(cfg, task, model, batch, chunk, 0, 1, loss_scale=scale)
        out[chunk] = (grads, {n: p.detach().clone() for n, p in model.named_parameters()})
    norm = torch.cat([g.flatten() for g in out[0][0].values()]).norm()
    assert torch.isfinite(norm) and norm > 0.05 * scale  # the clip binds (the gradients carry the loss scale)
    for name, want in out[0][0].items():
        torch.testing.assert_close(out[ROWS][0][name], want, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(out[ROWS][1][name], out[0][1][name], rtol=1e-5, atol=1e-7)
    full = cfg.model_copy(deep=True)
    full.train.amp = "none"
    model = task.build_model()
    model.load_state_dict(state)
    exact = {n: g * scale for n, g in step_grads(full, task, model, batch, 0, 0, 1).items()}
    gap = torch.cat([(out[3][0][n] - g).flatten() for n, g in exact.items()]).norm()
    assert gap < 0.1 * torch.cat([g.flatten() for g in exact.values()]).norm(), (amp, float(gap / norm))
    # Adam's first step moves each weight by about ±lr: a sign flip of a tiny gradient moves it by 2·lr
    assert max((out[3][1][n] - p).abs().max() for n, p in out[0][1].items()) <= 2 * cfg.train.lr + 1e-6


def test_raydist_train_refuses_a_batchnorm_encoder_before_ray_starts(tmp_path, capsys, batchnorm_encoder):
    """`raydist train` with train.grad_cache_chunk and an image encoder with BatchNorm: exit 2 with the reason, and
    no Ray (this test is not marked slow: starting Ray would fail it, tests/conftest.py)."""
    from test_tasks_images import write_shape_pairs

    from raydist.cli import main

    data = write_shape_pairs(tmp_path, per_class={"train": 2, "val": 1, "test": 1}, rows_per_shard=20)
    args = [
        "train",
        "--data",
        str(data),
        "--storage",
        str(tmp_path / "runs"),
        "model.image_encoder=test-batchnorm",
    ]
    assert main([*args, "train.grad_cache_chunk=8", "train.batch_size=8"]) == 2
    err = capsys.readouterr().err
    assert (
        "train.grad_cache_chunk=8 with model.image_encoder=test-batchnorm: encoder.backbone.1 (BatchNorm2d): batch statistics"
        in err
    ), err
