"""Cost of gradient clustering: step time with GC statistics on vs off (1 process, CPU), the ratio measured
side by side in one run (plain and GC steps alternate, so load from other processes hits both alike), and
the memory GC adds (state, per-step tensors, measured peak RSS).

    python bench/bench_gc.py [--batch-sizes 128 512] [--clusters 10] [--steps 200] [--smoke]
"""

from __future__ import annotations

import argparse
import itertools
import resource
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from raydist.gradclust import GradientClustering

WARMUP = 5


def make_model(features: int, hidden: int, classes: int) -> nn.Sequential:
    """The classification MLP: features → hidden → hidden → classes, ReLU, float32."""
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, classes),
    )


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    gc: GradientClustering | None,
) -> None:
    """One SGD step on the SUM cross-entropy; with ``gc``: forward inside capture, after_backward."""
    optimizer.zero_grad(set_to_none=True)
    with gc.capture() if gc is not None else nullcontext():
        loss = F.cross_entropy(model(x), y, reduction="sum")
    loss.backward()
    if gc is not None:
        gc.after_backward(torch.arange(x.shape[0]))
    optimizer.step()


def time_both(args: argparse.Namespace, batch: int) -> tuple[list[float], list[float], GradientClustering]:
    """Step seconds (off, on), one plain and one GC step in turn."""
    torch.manual_seed(0)
    model = make_model(args.features, args.hidden, args.classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    gc = GradientClustering(model, args.clusters, update_every=args.update_every)
    x, y = torch.randn(batch, args.features), torch.randint(0, args.classes, (batch,))
    for _ in range(WARMUP):
        train_step(model, optimizer, x, y, None)
        train_step(model, optimizer, x, y, gc)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.steps):
        for on in (False, True):
            start = time.perf_counter()
            train_step(model, optimizer, x, y, gc if on else None)
            times[on].append(time.perf_counter() - start)
    return times[False], times[True], gc


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


def step_bytes(args: argparse.Namespace, batch: int, elem: int = 4) -> int:
    """Per-step tensors, analytic (every layer has one position): each layer's input a and output gradient
    δ kept from forward/backward until after_backward, B·(n_in + n_out), and its projections δ·d, a·c,
    2·B·K; plus the float64 distances [B, K]. (The bias column of ones is implicit, never stored.)"""
    dims = [args.features, args.hidden, args.hidden, args.classes]
    per_layer = sum(batch * (n_in + n_out + 2 * args.clusters) for n_in, n_out in itertools.pairwise(dims))
    return per_layer * elem + batch * args.clusters * 8


_RSS_CHILD = """
import resource, sys, torch
import bench_gc as b
args = b.parse_args(sys.argv[3:])
batch, on = int(sys.argv[1]), sys.argv[2] == "on"
torch.manual_seed(0)
model = b.make_model(args.features, args.hidden, args.classes)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
gc = b.GradientClustering(model, args.clusters, update_every=args.update_every) if on else None
x, y = torch.randn(batch, args.features), torch.randint(0, args.classes, (batch,))
for _ in range(2 * args.update_every):
    b.train_step(model, optimizer, x, y, gc)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def peak_rss(batch: int, on: bool, argv: list[str]) -> int:
    """Peak RSS (bytes) of a fresh process running 2·update_every steps with GC on or off."""
    out = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, str(batch), "on" if on else "off", *argv],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    )
    return int(out.stdout)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--clusters", type=int, default=10)
    parser.add_argument("--update-every", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--smoke", action="store_true", help="tiny model, batches 16 and 32, 20 steps")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.smoke:
        args.batch_sizes, args.features, args.hidden, args.steps = [16, 32], 16, 32, 20
    return args


def main() -> None:
    argv = sys.argv[1:]
    args = parse_args(argv)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), MLP {args.features}→{args.hidden}→"
        f"{args.hidden}→{args.classes} float32, SGD, K={args.clusters}, U-step every {args.update_every} "
        f"steps; {args.steps} plain and {args.steps} GC steps, alternating"
    )
    print(
        "\n| batch | plain median (ms) | GC median (ms) | ratio of medians | ratio of minima | GC state "
        "| per-step tensors | peak RSS Δ |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch in args.batch_sizes:
        off, on, gc = time_both(args, batch)
        rss = peak_rss(batch, True, argv) - peak_rss(batch, False, argv)
        state, tensors = state_bytes(gc) / 1024, step_bytes(args, batch) / 1024
        med_off, med_on = statistics.median(off), statistics.median(on)
        print(
            f"| {batch} | {med_off * 1e3:.2f} | {med_on * 1e3:.2f} | {med_on / med_off:.2f}× "
            f"| {min(on) / min(off):.2f}× | {state:.0f} KiB | {tensors:.0f} KiB | {rss / 2**20:.1f} MiB |"
        )
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"\n(this process's peak RSS: {self_rss:.0f} MiB; assignments add one dict entry per sample id seen)"
    )


if __name__ == "__main__":
    main()
