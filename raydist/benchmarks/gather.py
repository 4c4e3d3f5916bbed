"""Benchmark of the step's all-gather ("gather"): at W = 2 gloo processes, the time of the gather step's
collectives (``raydist.distributed.gather_step`` forward and its reduce-scatter backward) against a loss step
(gather → negative-set draw → the pairs task's ranking loss → backward) and a whole training step (encoders
under DDP, the same gather and loss, backward, Adam), per global batch."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from raydist.benchmarks.catalog import register_benchmark
from raydist.benchmarks.harness import held, median, omp_wait_policy, row, spread
from raydist.config import load_config
from raydist.distributed import StepPlan, gather_step, step_generator
from raydist.distributed.spawn import free_port, spawn
from raydist.losses import rank_ranking_loss
from raydist.models import build_model

WORLD = 2
FULL_BATCHES, SMOKE_BATCHES = (1024, 8192), (64, 128)  # global batches (both ranks together)
SMOKE_DIM = 16
FEATURE_DIM, VOCAB = (
    128,
    400,
)  # the training step's image features and vocabulary (the default dataset's sizes)
TARGET_SHARE = 0.10


def _barrier_seconds(fn: Callable[[], object]) -> float:
    """Wall seconds of ``fn`` on every rank, between two barriers (the slower rank decides)."""
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def time_batch(rank: int, batch: int, dim: int, repeats: int) -> dict[str, list[float]]:
    """This rank's seconds of the collectives alone and of the whole loss step at global batch ``batch``:
    ``repeats`` interleaved timings of each after one warm-up of each."""
    lo = load_config("default").loss
    rows = batch // WORLD
    plan = StepPlan(batch, lo.negative_set_size, WORLD)
    g = torch.Generator().manual_seed(rank)
    img, cap = (
        torch.nn.functional.normalize(torch.randn(rows, dim, generator=g), dim=1).requires_grad_()
        for _ in range(2)
    )
    own = torch.arange(rank * rows, (rank + 1) * rows)
    ids = {"image_id": own // 5, "sample_id": own}  # 5 captions per image

    def collectives() -> None:
        gathered = gather_step({"img": img, "cap": cap}, ids)
        keys = [gathered.keys["img"], gathered.keys["cap"]]
        torch.autograd.backward(keys, [torch.ones_like(k) for k in keys])  # the gather's reduce-scatter

    def loss_of(emb_img: torch.Tensor, emb_cap: torch.Tensor) -> torch.Tensor:
        """The training step's cross-worker loss: one gather, the step's negative set, MH."""
        gathered = gather_step({"img": emb_img, "cap": emb_cap}, ids)
        return rank_ranking_loss(
            gathered,
            plan.draw(rank, step_generator(0, 0)),
            ids="image_id",
            margin=lo.margin,
            hardest=lo.hardest,
            reduction=lo.reduction,
            similarity=lo.similarity,
            tile=lo.tile,
            stats={},
        )

    def loss_step() -> None:
        loss_of(img, cap).backward()

    cfg = load_config("default")
    torch.manual_seed(0)
    model = DistributedDataParallel(build_model(cfg, FEATURE_DIM, VOCAB))
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.train.lr)
    features = torch.randn(rows, FEATURE_DIM, generator=g)
    lengths = torch.randint(8, 17, (rows,), generator=g)  # synthetic captions: 8–16 tokens
    tokens = torch.randint(4, VOCAB, (rows, 16), generator=g)

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_of(*model(features, tokens, lengths)).backward()
        optimizer.step()

    runs = {"collectives": collectives, "step": loss_step, "train_step": train_step}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():
        fn()
    for _ in range(repeats):
        for name, fn in runs.items():
            img.grad = cap.grad = None
            times[name].append(_barrier_seconds(fn))
    return times


def gather_process(rank: int, port: int, batches: tuple[int, ...], dim: int, repeats: int, out: str) -> None:
    """Rank ``rank`` of :data:`WORLD` (gloo, one torch thread): :func:`time_batch` per global batch; rank 0
    writes the times to ``out``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    results = {str(batch): time_batch(rank, batch, dim, repeats) for batch in batches}
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


@register_benchmark("gather", order=5)
def gather_share(*, smoke: bool, repeats: int) -> str:
    """All-gather share of a step at W=2 (gloo), global batch 1024 and 8192."""
    batches = SMOKE_BATCHES if smoke else FULL_BATCHES
    dim = SMOKE_DIM if smoke else load_config("default").model.embed_dim
    with tempfile.TemporaryDirectory(prefix="raydist-bench-gather-") as tmp:
        out = Path(tmp) / "rank0.json"
        spawn(gather_process, (free_port(), batches, dim, repeats, str(out)), nprocs=WORLD)
        results = json.loads(out.read_text())
    ms = [("collectives", "{:.2f}"), ("step", "{:.1f}"), ("train_step", "{:.0f}")]
    rows = [
        row(
            "global batch (rows per rank)",
            "collectives fwd+bwd (ms)",
            "loss step (ms)",
            "share of loss step",
            "training step (ms)",
            "share of training step",
            "target",
            "held",
        ),
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for batch in batches:
        times = {k: [t * 1e3 for t in v] for k, v in results[str(batch)].items()}
        cells = {k: spread(times[k], fmt) for k, fmt in ms}
        loss_share = median(times["collectives"]) / median(times["step"])
        share = median(times["collectives"]) / median(times["train_step"])
        rows.append(
            row(
                f"{batch} ({batch // WORLD})",
                cells["collectives"],
                cells["step"],
                f"{100 * loss_share:.1f} %",
                cells["train_step"],
                f"{100 * share:.1f} %",
                f"≤ {100 * TARGET_SHARE:.0f} %",
                held(share <= TARGET_SHARE),
            )
        )
    cfg = load_config("default")
    lo = cfg.loss
    return (
        f"{WORLD} spawned gloo processes on localhost, 1 torch thread each (OMP_WAIT_POLICY={omp_wait_policy()}), "
        f"float32, embeddings of {dim} dims. Collectives = `gather_step` of `img`, `cap` (autograd all-gather) and "
        "`image_id`, `sample_id`, then the backward of the gathered embeddings (autograd's reduce-scatter). Loss "
        "step = the same gather, the negative-set draw and the pairs task's `rank_ranking_loss` (default preset: "
        f"MH {lo.hardest}, margin {lo.margin}, {lo.reduction}, tile {lo.tile}, statistics on), then backward: no "
        "encoders, the upper bound of the share. Training step = the default preset's model "
        f"(embed {cfg.model.embed_dim}, GRU word dim {cfg.model.word_dim}; {FEATURE_DIM}-d features, captions of "
        f"8–16 tokens, vocabulary {VOCAB}) under DDP, encode → the same gather and loss → backward (DDP's gradient "
        "all-reduce included) → Adam step; the target is judged on it. ms between two barriers on rank 0, median "
        f"(min–max) of {repeats} interleaved runs after one warm-up.\n\n" + "\n".join(rows)
    )
