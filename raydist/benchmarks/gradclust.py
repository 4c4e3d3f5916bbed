"""Benchmark of gradient clustering's cost ("gradclust"; "gc" selects it too): training step time with GC statistics on vs off (same
model, batch and data; plain and GC steps alternate, so load from other processes hits both alike), at W = 1
(one process) and W = 2 (gloo processes, DDP), and the memory GC adds (its state, the per-step tensors, the
measured peak RSS of a fresh process)."""

from __future__ import annotations

import itertools
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from raydist.benchmarks.catalog import register_benchmark
from raydist.benchmarks.harness import held, row, spread
from raydist.console import say
from raydist.distributed.spawn import free_port, spawn
from raydist.gradclust import GradientClustering
from raydist.malloc import tune_malloc

TARGET = 1.10  # issue #50 (issue #11 had 1.2×): a GC step at most 1.10× the plain step
WARMUP = 5
STEPS_PER_REPEAT = 40  # timed steps of each kind per suite repeat (200 for the suite's default 5)


@dataclass(frozen=True)
class Sizes:
    """The classification MLP ``features → hidden → hidden → classes`` (float32, ReLU), K clusters, a U-step
    every ``update_every`` steps, the per-worker batches and the timed steps of each kind."""

    features: int = 256
    hidden: int = 512
    classes: int = 10
    clusters: int = 10
    update_every: int = 10
    stats_every: int = 4  # the third arm: statistics on every k-th step (gc.stats_every), the cost per step
    batches: tuple[int, ...] = (128, 512)
    steps: int = 200

    @classmethod
    def for_mode(cls, smoke: bool, repeats: int) -> Sizes:
        if smoke:
            return cls(features=16, hidden=32, batches=(16, 32), steps=20)
        return cls(steps=STEPS_PER_REPEAT * repeats)

    @property
    def dims(self) -> list[int]:
        return [self.features, self.hidden, self.hidden, self.classes]


def make_model(sizes: Sizes) -> nn.Sequential:
    """The MLP of ``sizes`` (seeded by the caller)."""
    d = sizes.dims
    return nn.Sequential(
        nn.Linear(d[0], d[1]), nn.ReLU(), nn.Linear(d[1], d[2]), nn.ReLU(), nn.Linear(d[2], d[3])
    )


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    gc: GradientClustering | None,
    skipped: int = 0,
) -> None:
    """One SGD step on the SUM cross-entropy; with ``gc``: forward inside capture, then after_backward; then
    ``skipped`` more steps with GC attached but not capturing (what the training hook does between
    statistics steps with ``gc.stats_every = skipped + 1``)."""
    optimizer.zero_grad(set_to_none=True)
    with gc.capture() if gc is not None else nullcontext():
        loss = F.cross_entropy(model(x), y, reduction="sum")
    loss.backward()
    if gc is not None:
        gc.after_backward(torch.arange(x.shape[0]))
    optimizer.step()
    for _ in range(skipped):
        train_step(model, optimizer, x, y, None)


def time_both(sizes: Sizes, batch: int, rank: int = 0) -> tuple[dict[str, list[float]], GradientClustering]:
    """Seconds per step, wall and this thread's CPU time, GC off, on, and on every ``stats_every``-th step:
    one plain step, one GC step and one unit of ``stats_every`` steps (a GC step, then plain steps with GC
    attached; its time divided by ``stats_every``) in turn after :data:`WARMUP` of each, on one model (its
    weights stay as warm in the caches as in a run). GC's forward hooks are removed before each plain step
    and put back before each GC step, outside the timed step, so the plain step runs the model as if GC were
    not attached. Under DDP (an initialised process group) the model is wrapped and GC clusters the inner
    module's layers (its U-step all-reduces over the workers: the two GC arms' statistics steps count alike
    towards ``update_every``)."""
    torch.manual_seed(0)
    model = make_model(sizes)
    gc = GradientClustering(model, sizes.clusters, update_every=sizes.update_every)
    net = nn.parallel.DistributedDataParallel(model) if dist.is_initialized() else model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    k = sizes.stats_every
    arms = {"off": (gc.detach, None, 0), "on": (gc.attach, gc, 0), "every": (gc.attach, gc, k - 1)}
    g = torch.Generator().manual_seed(1 + rank)
    x, y = (
        torch.randn(batch, sizes.features, generator=g),
        torch.randint(0, sizes.classes, (batch,), generator=g),
    )
    for _ in range(WARMUP):
        for hooks, clustering, skipped in arms.values():
            hooks()
            train_step(net, optimizer, x, y, clustering, skipped)
    times: dict[str, list[float]] = {f"{key}{kind}": [] for key in arms for kind in ("", "_cpu")}
    for _ in range(sizes.steps):
        for key, (hooks, clustering, skipped) in arms.items():
            hooks()
            wall, cpu = time.perf_counter(), time.thread_time()
            train_step(net, optimizer, x, y, clustering, skipped)
            times[f"{key}_cpu"].append((time.thread_time() - cpu) / (skipped + 1))
            times[key].append((time.perf_counter() - wall) / (skipped + 1))
    return times, gc


def state_bytes(gc: GradientClustering) -> int:
    """Bytes of the clustering's tensors besides the per-example assignments (centres, counts, window)."""
    state = gc.state_dict()
    del state["assignments"]
    total, stack = 0, [state]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, torch.Tensor):
            total += item.numel() * item.element_size()
    return total


def step_bytes(sizes: Sizes, batch: int, elem: int = 4) -> int:
    """Per-step tensors, analytic (every layer has one position): each layer's input a and output gradient
    δ kept from forward/backward until after_backward, B·(n_in + n_out), and its projections δ·d, a·c,
    2·B·K; plus the float64 distances [B, K]. (The bias column of ones is implicit, never stored.)"""
    k = sizes.clusters
    per_layer = sum(batch * (n_in + n_out + 2 * k) for n_in, n_out in itertools.pairwise(sizes.dims))
    return per_layer * elem + batch * k * 8


def peak_rss_child() -> None:
    """In a fresh process (argv: JSON sizes, batch, "on"/"off"): 2·update_every steps, print the peak RSS in
    bytes."""
    sizes = Sizes(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(sys.argv[1]).items()})
    batch, on = int(sys.argv[2]), sys.argv[3] == "on"
    torch.set_num_threads(1)
    tune_malloc()
    torch.manual_seed(0)
    model = make_model(sizes)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    gc = GradientClustering(model, sizes.clusters, update_every=sizes.update_every) if on else None
    x, y = torch.randn(batch, sizes.features), torch.randint(0, sizes.classes, (batch,))
    for _ in range(2 * sizes.update_every):
        train_step(model, optimizer, x, y, gc)
    say(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def peak_rss(sizes: Sizes, batch: int, on: bool) -> int:
    """Peak RSS (bytes) of :func:`peak_rss_child` with GC on or off."""
    code = "from raydist.benchmarks.gradclust import peak_rss_child; peak_rss_child()"
    args = [json.dumps(asdict(sizes)), str(batch), "on" if on else "off"]
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1])


def _rank_process(rank: int, port: int, sizes: Sizes, out: str) -> None:
    """Rank ``rank`` of 2 (gloo, one torch thread): :func:`time_both` per batch; rank 0 writes the times."""
    torch.set_num_threads(1)
    tune_malloc()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        results = {str(batch): time_both(sizes, batch, rank)[0] for batch in sizes.batches}
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def time_two_workers(sizes: Sizes) -> dict[str, dict[str, list[float]]]:
    """:func:`time_both` at W = 2 (two spawned gloo processes, DDP); rank 0's times per batch."""
    with tempfile.TemporaryDirectory(prefix="raydist-bench-gc-") as tmp:
        out = Path(tmp) / "rank0.json"
        spawn(_rank_process, (free_port(), sizes, str(out)), nprocs=2)
        return json.loads(out.read_text())


def _ms(values: list[float]) -> str:
    return spread([v * 1e3 for v in values], "{:.2f}")


def block_ratios(on: list[float], off: list[float], blocks: int) -> list[float]:
    """``median(on) / median(off)`` in each of ``blocks`` consecutive, equal blocks of the alternating steps
    (a leftover tail joins the last block): the spread of the ratio over the run."""
    size = max(len(on) // blocks, 1)
    starts = list(range(0, size * max(min(blocks, len(on)), 1), size))
    ends = [*starts[1:], len(on)]
    return [
        statistics.median(on[a:b]) / statistics.median(off[a:b]) for a, b in zip(starts, ends, strict=True)
    ]


def _ratio(times: dict[str, list[float]], key: str, blocks: int, arm: str = "on") -> tuple[float, str]:
    """The ratio of the medians over all steps of ``arm`` vs the plain arm, and that cell: ratio (min–max of
    the per-block ratios)."""
    on, off = times[f"{arm}{key}"], times[f"off{key}"]
    ratio = statistics.median(on) / statistics.median(off)
    parts = block_ratios(on, off, blocks)
    return ratio, f"{ratio:.2f}× ({min(parts):.2f}–{max(parts):.2f})"


def _row(batch: int, world: int, times: dict[str, list[float]], memory: list[str], blocks: int) -> str:
    wall, wall_cell = _ratio(times, "", blocks)
    _, cpu_cell = _ratio(times, "_cpu", blocks)
    every, every_cell = _ratio(times, "", blocks, arm="every")
    return row(
        batch,
        world,
        _ms(times["off"]),
        _ms(times["on"]),
        wall_cell,
        cpu_cell,
        held(wall <= TARGET),
        every_cell,
        held(every <= TARGET),
        *memory,
    )


@register_benchmark("gradclust", order=6, aliases=("gc",))
def gc_cost(*, smoke: bool, repeats: int) -> str:
    """Step time with gradient clustering statistics on vs off (W=1 and W=2), and the memory GC adds."""
    sizes = Sizes.for_mode(smoke, repeats)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tune_malloc()  # as in a training process (train.tune_malloc; the benchmark's process keeps it)
    try:
        single = {batch: time_both(sizes, batch) for batch in sizes.batches}
    finally:
        torch.set_num_threads(threads)
    double = time_two_workers(sizes)
    blocks = max(sizes.steps // STEPS_PER_REPEAT, 2)  # the ratio's spread: one block per repeat
    rows = [
        row(
            "batch per worker",
            "W",
            "plain step (ms)",
            "GC step (ms)",
            "GC / plain (wall)",
            "GC / plain (CPU)",
            f"≤ {TARGET:.2f}×",
            f"GC every {sizes.stats_every}th step / plain (wall)",
            f"≤ {TARGET:.2f}×",
            "GC state",
            "per-step tensors",
            "peak RSS Δ",
        ),
        "|---:|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|",
    ]
    for batch in sizes.batches:
        times, gc = single[batch]
        rss = (
            "—"
            if smoke
            else f"{(peak_rss(sizes, batch, True) - peak_rss(sizes, batch, False)) / 2**20:.1f} MiB"
        )
        memory = [f"{state_bytes(gc) / 1024:.0f} KiB", f"{step_bytes(sizes, batch) / 1024:.0f} KiB", rss]
        rows.append(_row(batch, 1, times, memory, blocks))
        rows.append(_row(batch, 2, double[str(batch)], ["same", "same", "—"], blocks))
    d = sizes.dims
    return (
        f"MLP {d[0]}→{d[1]}→{d[2]}→{d[3]} float32, SGD on the summed cross-entropy, K = {sizes.clusters} clusters, "
        f"online U-step every {sizes.update_every} steps; one torch thread and malloc thresholds as in a "
        "training process (`train.tune_malloc`) per worker; W = 2: two spawned gloo "
        "processes on localhost, DDP, the batch per worker as at W = 1, rank 0's times. "
        f"{sizes.steps} plain steps, {sizes.steps} GC steps and {sizes.steps} units of {sizes.stats_every} steps "
        f"with GC statistics on the first (`gc.stats_every={sizes.stats_every}`; per step = the unit's time / "
        f"{sizes.stats_every}) in turn on one model after {WARMUP} warm-up rounds, GC's forward hooks removed before each plain step and put back before each GC step (outside the "
        "timed step); ms as "
        "median (min–max) of wall time; the ratios are of medians over all steps, wall and this thread's CPU "
        f"time (the CPU ratio is less sensitive to other processes on a shared machine), with (min–max) the "
        f"ratio of medians in each of {blocks} consecutive blocks of the run; the steps alternate, so load from "
        "other processes hits both arms alike. Memory (W = 1): GC state = "
        "centres, counts and the open window; per-step tensors = analytic; peak RSS Δ = fresh process with "
        "GC on minus off (not measured in smoke mode).\n\n" + "\n".join(rows)
    )
