"""Cost of cross-worker negatives: step time gather vs local-only at W=2 (gloo, CPU), bytes moved by the
gather, and the peak memory of the dense ranking-loss score blocks.

    python bench/bench_negatives.py [--batch-sizes 64 256 1024] [--dim 128] [--steps 20]
                                    [--memory-sizes 2048 4096 8192]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from raydist.config import LossSection
from raydist.distributed import step_ranking_loss
from raydist.losses import l2_normalize

WORLD = 2
WARMUP = 5
FEATURES, VOCAB, TOKENS = 256, 1000, 12


class TinyVSE(nn.Module):
    """Linear image projection + mean EmbeddingBag captions (float32)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.img = nn.Linear(FEATURES, dim)
        self.txt = nn.EmbeddingBag(VOCAB, dim, mode="mean")

    def forward(self, features: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return l2_normalize(self.img(features)), l2_normalize(self.txt(tokens))


def _time_steps(rank: int, init_file: str, batch_sizes: list[int], dim: int, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = DistributedDataParallel(TinyVSE(dim))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rows = []
    for batch_size in batch_sizes:
        local = batch_size // WORLD
        g = torch.Generator().manual_seed(rank)
        features = torch.randn(local, FEATURES, generator=g)
        tokens = torch.randint(0, VOCAB, (local, TOKENS), generator=g)
        ids = torch.arange(rank * local, (rank + 1) * local)
        for gather in (True, False):
            cfg = LossSection(gather=gather)
            times = []
            for step in range(steps + WARMUP):
                dist.barrier()
                start = time.perf_counter()
                img, cap = model(features, tokens)
                loss = step_ranking_loss(
                    img, cap, image_ids=ids, loss_cfg=cfg, batch_size=batch_size, hardest=True
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if step >= WARMUP:
                    times.append(time.perf_counter() - start)
            rows.append((batch_size, gather, statistics.median(times)))
    if rank == 0:
        torch.save(rows, out)
    dist.destroy_process_group()


def gather_bytes(batch_size: int, dim: int, world: int = WORLD, elem: int = 4) -> int:
    """Bytes one rank receives per step: forward all-gather of img and cap ((W−1)·B·D·elem each) and of
    int64 image ids ((W−1)·B·8), plus the backward reduce-scatter of both embedding gradients (same size)."""
    local = batch_size // world
    return 2 * 2 * (world - 1) * local * dim * elem + (world - 1) * local * 8


_MEMORY_CHILD = """
import resource, sys, torch
from raydist.losses import ranking_loss
torch.set_num_threads(1)
n, d = int(sys.argv[1]), int(sys.argv[2])
img = torch.nn.functional.normalize(torch.randn(n, d), dim=1).requires_grad_()
cap = torch.nn.functional.normalize(torch.randn(n, d), dim=1).requires_grad_()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ranking_loss(img, cap, hardest=True).backward()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
"""


def measured_peak_bytes(n: int, dim: int) -> int:
    """Peak RSS growth of one MH ranking_loss forward+backward on n pairs, in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, str(n), str(dim)], check=True, capture_output=True
    )
    return int(out.stdout)


def dense_block_bytes(queries: int, keys: int) -> int:
    """Analytic forward peak of ``ranking_terms`` on a [queries × keys] block, float32: per direction the
    scores, the hinge argument, its clamp and the masked costs (4 × 4 bytes), plus the shared bool mask."""
    return queries * keys * (2 * 16 + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--memory-sizes", type=int, nargs="+", default=[2048, 4096, 8192])
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, W={WORLD} gloo CPU processes, 1 thread each, D={args.dim}, MH, float32"
    )

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rows.pt")
        mp.spawn(
            _time_steps,
            args=(str(Path(tmp) / "init"), args.batch_sizes, args.dim, args.steps, out),
            nprocs=WORLD,
            join=True,
        )
        rows = torch.load(out)
    times = {(b, gather): t for b, gather, t in rows}
    print("\n| global batch | step gather (ms) | step local-only (ms) | overhead | gather bytes/step/rank |")
    print("|---:|---:|---:|---:|---:|")
    for b in args.batch_sizes:
        tg, tl = times[(b, True)], times[(b, False)]
        print(
            f"| {b} | {tg * 1e3:.2f} | {tl * 1e3:.2f} | {tg / tl:.2f}× | {gather_bytes(b, args.dim) / 1024:.1f} KiB |"
        )

    print(
        "\n| pairs G | dense G×G analytic | measured peak RSS growth | per-rank B×G block at W=2 (analytic) |"
    )
    print("|---:|---:|---:|---:|")
    for n in args.memory_sizes:
        dense = dense_block_bytes(n, n)
        measured = measured_peak_bytes(n, args.dim)
        block = dense_block_bytes(n // WORLD, n)
        print(f"| {n} | {dense / 2**20:.0f} MiB | {measured / 2**20:.0f} MiB | {block / 2**20:.0f} MiB |")


if __name__ == "__main__":
    main()
