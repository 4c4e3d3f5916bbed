"""Benchmark of gradient caching ("grad-cache", ``train.grad_cache_chunk``): peak memory and step time of the
training step as the batch grows, with and without caching, and the largest batch that fits a memory budget
each way.

Every measurement runs in a fresh process (:func:`measure_child`): peak RSS only grows within a process, and on
a GPU ``torch.cuda.max_memory_allocated`` is read after the steps. The step is the real one
(:func:`raydist.train.loop.train_step`) of the pairs task (an image encoder over random 32 px images, the tiny
preset's GRU over random captions, MH over the batch) in one process: gradient caching bounds the encoders'
activations, which do not depend on the worker count.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from raydist.benchmarks.catalog import register_benchmark
from raydist.benchmarks.harness import row, spread
from raydist.console import say

ENCODERS = ("small-cnn", "resnet18-gn")  # the second only where torchvision imports
RESNET = "resnet18-gn"  # torchvision's ResNet-18 with GroupNorm (BatchNorm is refused under caching)
WORDS = 1000  # the captions' vocabulary
CAPTION_LEN = 12


@dataclass(frozen=True)
class Sizes:
    """Batches (rows per step), the image side, the cache chunk, timed steps per measurement (after one warm-up
    step), the small CNN's width, the memory budget and the device."""

    batches: tuple[int, ...] = (256, 1024, 4096)
    image: int = 32
    chunk: int = 128
    steps: int = 2
    width: int = 32
    budget_mib: int = 2048
    device: str = "cpu"

    @classmethod
    def for_mode(cls, smoke: bool, repeats: int) -> Sizes:
        if smoke:
            return cls(batches=(16, 48), image=16, chunk=8, steps=1, width=8, budget_mib=1024)
        return cls(steps=max(1, min(repeats, 3)))


def _register_resnet() -> bool:
    """Register :data:`RESNET` in this process when torchvision imports (its ResNet-18 with GroupNorm(32) in
    place of BatchNorm, classifier removed); False without torchvision."""
    try:
        models = importlib.import_module("torchvision.models")
    except ImportError:
        return False
    from torch import nn

    from raydist.models.image_encoders import Backbone, image_encoder_names, register_image_encoder

    if RESNET in image_encoder_names():
        return True

    @register_image_encoder(RESNET)
    def _resnet(*, in_dim: int | None, channels: int, image_size: int | None) -> Backbone:
        net = models.resnet18(norm_layer=lambda c: nn.GroupNorm(32, c))
        dim = net.fc.in_features
        net.fc = nn.Identity()
        return Backbone(net, dim)

    return True


def measure_child() -> None:
    """In a fresh process (argv: JSON sizes, encoder, batch, chunk): print :func:`measure_cell`'s JSON."""
    sizes = Sizes(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(sys.argv[1]).items()})
    say(json.dumps(measure_cell(sizes, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))


def measure_cell(sizes: Sizes, encoder: str, batch: int, chunk: int) -> dict:
    """One warm-up and ``sizes.steps`` timed training steps of ``batch`` rows with ``train.grad_cache_chunk=chunk``:
    ``{"peak_bytes", "base_bytes", "seconds", "cpu_seconds"}`` (CPU: this process's peak RSS, and its peak before
    the first step; GPU: ``max_memory_allocated``, and the memory allocated before the first step; the wall and
    the process CPU seconds of each timed step)."""
    import numpy as np
    import torch

    from raydist.config import load_config
    from raydist.data import Vocab
    from raydist.distributed import StepPlan
    from raydist.malloc import tune_malloc
    from raydist.tasks import DataInfo, StepContext, build_task
    from raydist.train.loop import Trainables, train_step

    tune_malloc()
    if encoder == RESNET and not _register_resnet():
        raise SystemExit("torchvision is not installed")
    device = torch.device(sizes.device)
    with tempfile.TemporaryDirectory(prefix="raydist-bench-gc-") as tmp:
        vocab = Path(tmp) / "vocab.json"
        Vocab.build([" ".join(f"w{i}" for i in range(WORDS))]).save(vocab)
        cfg = load_config(
            "tiny",
            overrides={
                "model.image_encoder": encoder,
                "model.cnn_width": sizes.width,
                "data.image_size": sizes.image,
                "data.max_caption_len": CAPTION_LEN,
                "train.batch_size": batch,
                "train.num_workers": 0,
                "train.grad_cache_chunk": chunk,
                "train.use_gpu": device.type == "cuda",
                "loss.warmup_sh_epochs": 0,
            },
            task_of=lambda _: "pairs",
        )
        info = DataInfo(
            "pairs",
            None,
            files={"vocab.json": vocab},
            image_format="encoded",
            image_channels=3,
            image_size=(sizes.image, sizes.image),
        )
        task = build_task(cfg, info)
        torch.manual_seed(0)
        parts = Trainables.build(cfg, task.build_model().to(device), device)
    g = np.random.default_rng(0)
    lengths = g.integers(4, CAPTION_LEN + 1, batch)
    tokens = g.integers(4, len(task.tokenizer), (batch, CAPTION_LEN))
    tokens[np.arange(CAPTION_LEN)[None] >= lengths[:, None]] = 0
    rows = {
        "image": g.normal(size=(batch, 3, sizes.image, sizes.image)).astype(np.float32),
        "tokens": tokens,
        "lengths": lengths,
        "image_id": np.arange(batch),
        "sample_id": np.arange(batch),
    }
    plan = StepPlan(batch, None, 1)
    seconds = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cpu_seconds = []
    for step in range(sizes.steps + 1):
        start, cpu = time.perf_counter(), time.process_time()
        train_step(parts, task, rows, cfg, plan, StepContext(0, step, 0, 1), device, {})
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step:  # the first step warms up
            seconds.append(time.perf_counter() - start)
            cpu_seconds.append(time.process_time() - cpu)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_bytes": peak, "base_bytes": base, "seconds": seconds, "cpu_seconds": cpu_seconds}


def measure(sizes: Sizes, encoder: str, batch: int, chunk: int, *, fresh: bool = True) -> dict | None:
    """:func:`measure_cell` in a fresh process (``fresh``; else in this one, whose memory then says nothing);
    None when it fails (e.g. out of memory)."""
    if not fresh:
        return measure_cell(sizes, encoder, batch, chunk)
    code = "from raydist.benchmarks.gradient_caching import measure_child; measure_child()"
    args = [json.dumps(asdict(sizes)), encoder, str(batch), str(chunk)]
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return None
    return json.loads(lines[-1])


def largest_fitting(results: dict[int, dict | None], budget_bytes: int) -> str:
    """The largest measured batch whose peak memory is within the budget ("none" when no batch is)."""
    fits = [b for b, r in results.items() if r is not None and r["peak_bytes"] <= budget_bytes]
    return str(max(fits)) if fits else "none"


def _peak_mib(result: dict | None) -> str:
    return "failed" if result is None else f"{result['peak_bytes'] / 2**20:,.0f}"


def _seconds(result: dict | None) -> str:
    return "—" if result is None else spread(result["seconds"], "{:.2f}")


def _ratio(on: dict | None, off: dict | None, key: str) -> str:
    """``median(on[key]) / median(off[key])``, or a dash when either measurement failed."""
    if off is None or on is None:
        return "—"
    return f"{statistics.median(on[key]) / statistics.median(off[key]):.2f}×"


@register_benchmark("grad-cache", order=14)
def grad_cache_memory(*, smoke: bool, repeats: int, device: str = "cpu") -> str:
    """Peak memory and step time vs batch size with and without gradient caching (small CNN, ResNet-18)."""
    sizes = Sizes.for_mode(smoke, repeats)
    sizes = Sizes(**{**asdict(sizes), "device": device})
    mib = 2**20
    memory = "max_memory_allocated" if device == "cuda" else "peak RSS"
    rows = [
        row(
            "encoder",
            "batch",
            f"off: {memory} (MiB)",
            f"chunk {sizes.chunk}: {memory} (MiB)",
            "off: step (s)",
            f"chunk {sizes.chunk}: step (s)",
            "cached / off (wall)",
            "cached / off (CPU)",
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    fitting, missing = [], []
    # smoke mode runs in this process: the small CNN only (the ResNet would be registered in this process)
    for encoder in ENCODERS[:1] if smoke else ENCODERS:
        if encoder == RESNET and importlib.util.find_spec("torchvision") is None:
            missing.append("torchvision is not installed: the ResNet-18 (GroupNorm) rows were not measured")
            continue
        results: dict[int, dict[int, dict | None]] = {0: {}, sizes.chunk: {}}
        for batch in sizes.batches:
            for chunk, by_batch in results.items():
                by_batch[batch] = measure(sizes, encoder, batch, chunk, fresh=not smoke)
            off, on = results[0][batch], results[sizes.chunk][batch]
            rows.append(
                row(
                    encoder,
                    batch,
                    _peak_mib(off),
                    _peak_mib(on),
                    _seconds(off),
                    _seconds(on),
                    _ratio(on, off, "seconds"),
                    _ratio(on, off, "cpu_seconds"),
                )
            )
        budget = sizes.budget_mib * mib
        fitting.append(
            f"{encoder}: the largest measured batch within {sizes.budget_mib:,} MiB is "
            f"{largest_fitting(results[0], budget)} without caching and "
            f"{largest_fitting(results[sizes.chunk], budget)} with chunks of {sizes.chunk}"
        )
    what = (
        f"The pairs task's training step (tiny preset: GRU captions of {CAPTION_LEN} tokens, MH over the batch) "
        f"with an image encoder over random {sizes.image} px images (small-cnn width {sizes.width}; "
        f"torchvision's ResNet-18 with GroupNorm where torchvision imports), one process on {device}, "
        f"train.grad_cache_chunk=0 (off) vs {sizes.chunk}; each cell a fresh process: one warm-up step, then "
        f"{sizes.steps} timed steps (wall seconds, median (min–max)); the ratios are of medians, wall and the "
        "process's CPU time (less sensitive to other processes on a shared machine); "
        f"memory = {memory} of that process"
        + (", imports and model included" if device == "cpu" else "")
        + ". "
    )
    if smoke:
        what += (
            "Smoke mode: the small CNN's cells in this process (their memory figures are not comparable). "
        )
    return what + "\n\n" + "\n\n".join([*fitting, *missing]) + "\n\n" + "\n".join(rows)
