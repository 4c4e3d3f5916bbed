"""Benchmarks of the VSE++ ranking loss: MH forward+backward time against the dense mask-and-clamp
formulation and the score matmul ("loss"), and peak memory against the global batch ("loss-memory")."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from raydist.benchmarks.catalog import register_benchmark
from raydist.benchmarks.harness import ms_spread, seconds
from raydist.console import say
from raydist.losses import TILE_ELEMENTS, ranking_loss

MARGIN = 0.2
TIME_SIZES = ((4096, 256), (1024, 1024), (16384, 256))  # (global batch B, dim D)
MEMORY_BATCHES, MEMORY_DIM = (4096, 8192, 16384, 32768, 65536), 256
SMOKE_TIME_SIZES, SMOKE_MEMORY_BATCHES, SMOKE_MEMORY_DIM = ((64, 16), (32, 32)), (64,), 16
DENSE_CAP_BYTES = 4 << 30  # address space the dense formulation may add in the memory benchmark


def dense_max_of_hinges(img: Tensor, cap: Tensor, margin: float = MARGIN) -> Tensor:
    """VSE++ MH the straightforward way: ``S = img·capᵀ``, positives on its diagonal, clamp, mask, max, sum.

    ``Σ_k max_{l≠k} [α − S_kk + S_kl]₊ + Σ_l max_{k≠l} [α − S_ll + S_kl]₊``; every op is [B, B].
    """
    scores = img @ cap.T
    positives = scores.diagonal().unsqueeze(1)
    own = torch.eye(scores.shape[0], dtype=torch.bool, device=scores.device)
    image_costs = (margin + scores - positives).clamp(min=0).masked_fill(own, 0)
    caption_costs = (margin + scores - positives.T).clamp(min=0).masked_fill(own, 0)
    return image_costs.max(1).values.sum() + caption_costs.max(0).values.sum()


def unit_pairs(batch: int, dim: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Random L2-normalised image and caption embeddings [B, D] (float32 leaves that require grad)."""
    g = torch.Generator().manual_seed(seed)
    img, cap = (torch.nn.functional.normalize(torch.randn(batch, dim, generator=g), dim=1) for _ in range(2))
    return img.requires_grad_(), cap.requires_grad_()


def _mh(img: Tensor, cap: Tensor) -> Tensor:
    return ranking_loss(img, cap, margin=MARGIN, hardest=True)


def _sh(img: Tensor, cap: Tensor) -> Tensor:
    return ranking_loss(img, cap, margin=MARGIN, hardest=False)


LOSSES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "mh": _mh,
    "sh": _sh,
    "dense-mh": dense_max_of_hinges,
}


def _forward_backward(loss: Callable[[Tensor, Tensor], Tensor], img: Tensor, cap: Tensor) -> float:
    img.grad = cap.grad = None
    value = loss(img, cap)
    value.backward()
    return float(value.detach())


def _matmul(img: Tensor, cap: Tensor) -> None:
    with torch.no_grad():
        img @ cap.T


def _time_size(batch: int, dim: int, repeats: int) -> str:
    """One table row of :func:`loss_time`."""
    img, cap = unit_pairs(batch, dim)
    runs = {
        "matmul": lambda: _matmul(img, cap),
        "mh": lambda: _forward_backward(_mh, img, cap),
        "dense": lambda: _forward_backward(dense_max_of_hinges, img, cap),
    }
    mh_value, dense_value = runs["mh"](), runs["dense"]()  # warm-up, and the two must agree
    if abs(mh_value - dense_value) > 1e-4 * max(1.0, abs(dense_value)):
        raise AssertionError(f"B={batch}: MH {mh_value} != dense {dense_value}")
    runs["matmul"]()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):  # interleaved, so that load changes hit all three alike
        for name, run in runs.items():
            times[name].append(seconds(run))
    med = {name: statistics.median(t) for name, t in times.items()}
    return (
        f"| {batch}×{dim} | {ms_spread(times['matmul'])} | {ms_spread(times['mh'])} | {ms_spread(times['dense'])} "
        f"| {med['dense'] / med['mh']:.1f}× | {med['mh'] / med['matmul']:.2f}× |"
    )


@register_benchmark("loss", order=1)
def loss_time(*, smoke: bool, repeats: int) -> str:
    """MH forward+backward vs the dense mask-and-clamp formulation and vs the forward score matmul."""
    rows = [_time_size(batch, dim, repeats) for batch, dim in (SMOKE_TIME_SIZES if smoke else TIME_SIZES)]
    return (
        f"float32, {torch.get_num_threads()} torch threads (OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}), margin {MARGIN}, unique ids. MH = "
        f"`ranking_loss(hardest=True)`: tiles of 4096 keys (default tile, = loss.tile) × {TILE_ELEMENTS // 4096} "
        "queries; dense = "
        "`dense_max_of_hinges` (raydist/benchmarks/loss.py). ms as median (min–max) of "
        f"{repeats} interleaved runs after one warm-up; the two losses agree to 1e-4.\n\n"
        "| B×D | score matmul `img @ cap.T` (ms) | MH fwd+bwd (ms) | dense MH fwd+bwd (ms) "
        "| dense / MH | MH / matmul |\n|---|---:|---:|---:|---:|---:|\n" + "\n".join(rows)
    )


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def peak_memory_child() -> None:
    """In a fresh process (argv: loss name, B, D, cap bytes or 0): print JSON with the peak RSS growth of
    one forward+backward, in bytes, and its seconds, or an error when the loss exceeds the address-space
    cap (``RLIMIT_AS`` = current size + cap)."""
    name, batch, dim, cap_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    img, cap = unit_pairs(batch, dim)
    _forward_backward(LOSSES[name], *unit_pairs(8, dim))  # thread pool and code pages, before any limit
    if cap_bytes:
        limit = _status_kib("VmSize") * 1024 + cap_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    before = _status_kib("VmRSS")
    try:
        wall = seconds(lambda: _forward_backward(LOSSES[name], img, cap))
    except (RuntimeError, MemoryError) as err:
        say(json.dumps({"error": str(err).splitlines()[0][:80]}))
        return
    say(json.dumps({"peak": (_status_kib("VmHWM") - before) * 1024, "seconds": wall}))


def measure_peak(name: str, batch: int, dim: int, cap_bytes: int = 0) -> dict[str, float | str]:
    """Run :func:`peak_memory_child` for one loss and size; its JSON answer."""
    code = "from raydist.benchmarks.loss import peak_memory_child; peak_memory_child()"
    out = subprocess.run(
        [sys.executable, "-c", code, name, str(batch), str(dim), str(cap_bytes)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _peak_cell(result: dict[str, float | str]) -> str:
    if "error" in result:
        return f"> cap ({DENSE_CAP_BYTES >> 30} GiB)"
    return f"{result['peak'] / 2**20:.0f} MiB ({result['seconds']:.2f} s)"


@register_benchmark("loss-memory", order=2)
def loss_memory(*, smoke: bool, repeats: int) -> str:
    """Peak memory of MH (and SH) forward+backward vs the global batch, against the dense formulation."""
    del repeats  # one run per size: a peak, not a timing
    batches, dim = (SMOKE_MEMORY_BATCHES, SMOKE_MEMORY_DIM) if smoke else (MEMORY_BATCHES, MEMORY_DIM)
    rows, dense_fits = [], True
    for batch in batches:
        cells = [_peak_cell(measure_peak(name, batch, dim)) for name in ("mh", "sh")]
        if dense_fits:
            dense = measure_peak("dense-mh", batch, dim, DENSE_CAP_BYTES)
            dense_fits = "error" not in dense
            cells.append(_peak_cell(dense))
        else:
            cells.append("not run (a smaller batch exceeded the cap)")
        rows.append(f"| {batch}×{dim} | " + " | ".join(cells) + " |")
    return (
        "Peak RSS growth of one forward+backward in a fresh process (VmHWM after − VmRSS before, the peak reset "
        "through /proc/self/clear_refs after the inputs exist), float32, `ranking_loss` (defaults as above); "
        f"the dense formulation runs under RLIMIT_AS = its size + {DENSE_CAP_BYTES >> 30} GiB and stops at "
        "the first batch that exceeds it. Wall seconds of that run in brackets.\n\n"
        "| B×D | MH peak | SH peak | dense MH peak |\n|---|---:|---:|---:|\n" + "\n".join(rows)
    )
