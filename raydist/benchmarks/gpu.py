"""The GPU check (issue #26): one pass, in minutes, over what a GPU changes -- the suite's GPU tests, a
`raydist train` run on nccl, faiss-gpu flat and IVF search, the tiled MH loss at 2^20 rows, images/s of the
image encoder, gradient caching's memory and time -- written as one markdown file; on a machine without a GPU it
says why and exits 0.

Run ``bash bench/gpu_check.sh OUT_DIR`` (or ``python -m raydist.benchmarks.gpu OUT_DIR``). Every row runs in
a subprocess of its own with a time limit (:func:`run_check`), so a hung or crashed row costs its limit and no
more; the limits sum to under 8 minutes. A row that cannot apply (one GPU: one worker; a faiss without GPU
support; no ``model.image_encoder``) is listed as skipped with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from raydist.console import say

RESULTS_FILE = "gpu_check.md"
LOSS_ROWS, LOSS_DIM = 1 << 20, 256  # the tiled MH loss: 2^20 pairs at D = 256
LOSS_STEPS = (1 << 16, 1 << 18, LOSS_ROWS)  # smaller sizes first: a row cut off at its limit keeps them
LOSS_CHECK_ROWS = 4096  # tiled MH == the dense formulation on the GPU at this size
FAISS_BASE, FAISS_DIM, FAISS_QUERIES, FAISS_K = 1_000_000, 128, 10_000, 10
IMAGE_BATCH, IMAGE_STEPS = 128, 10
GRAD_CACHE_BATCHES = (1024, 4096)  # the grad-cache row: small CNN at 32 px, train.grad_cache_chunk off vs 128
TRAIN_PRESET_ARGS = ("train.use_gpu=true",)  # the default preset on the embedded dataset, on the GPU


@dataclass
class Row:
    """One row of the results table."""

    name: str
    status: str  # "ok", "skipped", "failed", "timed out"
    seconds: float
    detail: str


def gpu_skip_reason() -> str | None:
    """Why the check cannot run here (no NVIDIA driver, or torch sees no CUDA device), or None."""
    if shutil.which("nvidia-smi") is None and not Path("/dev/nvidiactl").exists():
        return "no NVIDIA driver on this machine (nvidia-smi not on PATH, /dev/nvidiactl absent)"
    import torch

    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f", CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
        return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False{hint})"
    return None


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def gpu_test_files(tests: Path) -> list[Path]:
    """Test files that mention CUDA or the GPU (``cuda``, ``use_gpu``, ``gpu`` in their text)."""
    pattern = re.compile(r"cuda|use_gpu|\bgpu\b", re.IGNORECASE)
    return sorted(p for p in tests.glob("test_*.py") if pattern.search(p.read_text(encoding="utf-8")))


# --- the rows, each run as `python -m raydist.benchmarks.gpu --row NAME` and printing one JSON line ---


def row_loss() -> dict:
    """Tiled MH (``ranking_loss``, hardest) forward + backward at 2^16, 2^18 and 2^20 rows × 256 on one GPU:
    seconds and peak memory; first, its value against the dense formulation at 4096 rows on the same GPU."""
    import torch

    from raydist.benchmarks.loss import dense_max_of_hinges
    from raydist.losses import ranking_loss

    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)

    def pairs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        img = torch.nn.functional.normalize(torch.randn(n, LOSS_DIM, device=device, generator=gen), dim=1)
        cap = torch.nn.functional.normalize(
            img + 0.5 * torch.randn(n, LOSS_DIM, device=device, generator=gen), dim=1
        )
        return img.requires_grad_(), cap.requires_grad_()

    img, cap = pairs(LOSS_CHECK_ROWS)
    tiled, dense = ranking_loss(img, cap, hardest=True), dense_max_of_hinges(img, cap)
    check = abs(float(tiled) - float(dense)) / max(abs(float(dense)), 1e-12)
    parts = [f"at {LOSS_CHECK_ROWS} rows tiled vs dense relative difference {check:.1e}"]
    del img, cap, tiled, dense
    for rows in LOSS_STEPS:
        img, cap = pairs(rows)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        ranking_loss(img, cap, hardest=True).backward()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() - base
        parts.append(
            f"{rows:,} × {LOSS_DIM}: forward + backward {seconds:.1f} s, peak {peak / 2**30:.2f} GiB "
            f"above the inputs ({base / 2**30:.2f} GiB)"
        )
        say(json.dumps({"detail": "; ".join(parts)}))  # what a cut-off run keeps
        del img, cap
    return {"detail": "; ".join(parts)}


def row_faiss() -> dict:
    """faiss-gpu flat and IVF search (1M × 128, 10k queries, k = 10) against CPU flat on the same data."""
    import faiss
    import numpy as np

    from raydist.retrieval.index import build_index, unit_rows

    if faiss.get_num_gpus() == 0:
        return {
            "skipped": f"faiss {faiss.__version__} has no GPU support (a CPU build; pip install '.[gpu]')"
        }
    rng = np.random.default_rng(0)
    base = unit_rows(rng.standard_normal((FAISS_BASE, FAISS_DIM), dtype=np.float32))
    noise = rng.standard_normal((FAISS_QUERIES, FAISS_DIM), dtype=np.float32)
    queries = unit_rows(base[rng.choice(FAISS_BASE, FAISS_QUERIES, replace=False)] + 0.3 * noise)

    def timed(fn: Callable[[], object]) -> tuple[object, float]:
        start = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - start

    gpu_flat, build_s = timed(lambda: build_index(base, "flat", use_gpu=True))
    gpu_flat.search(queries[:100], FAISS_K)  # warm-up
    (_, exact), flat_s = timed(lambda: gpu_flat.search(queries, FAISS_K))
    cpu_flat = build_index(base, "flat", use_gpu=False)
    (_, cpu_ids), cpu_s = timed(lambda: cpu_flat.search(queries[:1000], FAISS_K))
    same = float((np.sort(cpu_ids, 1) == np.sort(exact[:1000], 1)).mean()) * 100
    nlist = 4096
    resources = faiss.StandardGpuResources()
    cpu_ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(FAISS_DIM), FAISS_DIM, nlist, faiss.METRIC_INNER_PRODUCT)
    gpu_ivf = faiss.index_cpu_to_gpu(resources, 0, cpu_ivf)
    _, ivf_build_s = timed(lambda: (gpu_ivf.train(base), gpu_ivf.add(base)))
    flat = (
        f"flat: build {build_s:.1f} s, {FAISS_QUERIES / flat_s:,.0f} queries/s on the GPU vs "
        f"{1000 / cpu_s:,.0f} on {os.cpu_count()} CPU threads, top-{FAISS_K} sets equal to CPU {same:.1f} %"
    )
    parts = [flat]
    for nprobe in (16, 64):
        gpu_ivf.nprobe = nprobe
        (_, ids), s = timed(lambda: gpu_ivf.search(queries, FAISS_K))
        recall = (
            np.mean([len(np.intersect1d(a, b)) for a, b in zip(ids, exact, strict=False)]) / FAISS_K * 100
        )
        parts.append(
            f"IVF{nlist} nprobe {nprobe}: {FAISS_QUERIES / s:,.0f} queries/s, R@10 vs flat {recall:.1f} %"
        )
    parts.append(f"IVF train + add {ivf_build_s:.1f} s")
    return {"detail": "; ".join(parts)}


def row_images() -> dict:
    """Images/s of ``model.image_encoder`` encoders on one GPU (forward + backward, batch 128, 224², fp32)."""
    import torch

    from raydist.config import ModelSection
    from raydist.models import build_image_encoder

    if "image_encoder" not in ModelSection.model_fields:
        return {"skipped": "model.image_encoder is not in the config (the image path has not landed)"}
    names = ["small-cnn"]
    try:
        import torchvision  # noqa: F401

        names.append("torchvision:resnet50")
    except ImportError:
        pass
    device = torch.device("cuda")
    images = torch.randn(IMAGE_BATCH, 3, 224, 224, device=device)
    parts = []
    for name in names:
        encoder = build_image_encoder(name, 1024, channels=3, image_size=224).to(device)
        for step in range(IMAGE_STEPS + 2):  # two warm-up steps
            if step == 2:
                torch.cuda.synchronize()
                start = time.perf_counter()
            encoder(images).square().mean().backward()
        torch.cuda.synchronize()
        rate = IMAGE_BATCH * IMAGE_STEPS / (time.perf_counter() - start)
        parts.append(f"{name}: {rate:,.0f} images/s")
    if len(names) == 1:
        parts.append("torchvision not installed: resnet50 not measured")
    return {"detail": "; ".join(parts)}


def row_grad_cache() -> dict:
    """Gradient caching on the GPU: ``max_memory_allocated`` and step time of the pairs task's training step with
    the small CNN at 32 px, batch 1024 and 4096, ``train.grad_cache_chunk`` off vs 128 (each cell in this
    process: the peak statistics are reset before it, :func:`raydist.benchmarks.gradient_caching.measure_cell`)."""
    from raydist.benchmarks.gradient_caching import Sizes, measure_cell

    sizes = Sizes(batches=GRAD_CACHE_BATCHES, steps=2, device="cuda")
    parts = []
    for batch in sizes.batches:
        off, on = (measure_cell(sizes, "small-cnn", batch, chunk) for chunk in (0, sizes.chunk))
        step_off, step_on = (min(r["seconds"]) for r in (off, on))
        parts.append(
            f"batch {batch}: {off['peak_bytes'] / 2**20:,.0f} MiB off vs {on['peak_bytes'] / 2**20:,.0f} MiB with "
            f"chunks of {sizes.chunk}, step {step_off * 1e3:.0f} vs {step_on * 1e3:.0f} ms ({step_on / step_off:.2f}×)"
        )
    return {"detail": "; ".join(parts)}


ROW_FUNCTIONS: dict[str, Callable[[], dict]] = {
    "loss": row_loss,
    "faiss": row_faiss,
    "images": row_images,
    "grad-cache": row_grad_cache,
}


# --- the driver ---


def _run(command: list[str], limit: float, cwd: Path) -> tuple[str, float, str]:
    """(status, seconds, output) of ``command`` under a ``limit`` in seconds."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return "timed out", time.perf_counter() - start, out
    status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
    return status, time.perf_counter() - start, done.stdout + done.stderr


def _tail(text: str, lines: int = 3) -> str:
    return " / ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())


def check_tests(root: Path, limit: float) -> Row:
    """The suite's GPU rows: ``-k "gpu or cuda"`` over the test files that mention the GPU."""
    files = gpu_test_files(root / "tests") if (root / "tests").is_dir() else []
    if not files:
        return Row("suite's GPU tests", "skipped", 0.0, "no test file mentions cuda or the GPU")
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-k",
        "gpu or cuda",
        *map(str, files),
    ]
    status, seconds, out = _run(command, limit, root)
    listed = ", ".join(p.name for p in files)
    return Row("suite's GPU tests", status, seconds, f"{listed}: {_tail(out, 1)}")


def check_train(root: Path, out_dir: Path, gpus: int, limit: float) -> Row:
    """`raydist train` (default preset, embedded dataset) on the GPU: 2 nccl workers with 2 GPUs, else 1."""
    workers = 2 if gpus >= 2 else 1
    outcome = out_dir / "train.json"
    command = [
        sys.executable,
        "-m",
        "raydist.cli",
        "train",
        *TRAIN_PRESET_ARGS,
        f"train.num_workers={workers}",
        "--name",
        f"gpu-check-{workers}w",
        "--force",
        "--json",
        str(outcome),
    ]
    status, seconds, out = _run(command, limit, root)
    (out_dir / "train.log").write_text(out)
    name = f"raydist train, {workers} worker{'s' if workers > 1 else ''} (nccl, train.use_gpu=true)"
    why = "" if workers == 2 else f"{gpus} GPU: one worker; "
    if status != "ok" or not outcome.exists():
        return Row(name, status, seconds, why + f"log {out_dir / 'train.log'}: {_tail(out)}")
    result = json.loads(outcome.read_text())
    first = re.search(r"first optimizer step ([\d.]+) s", out)
    test = result.get("test_metrics") or {}
    metrics = ", ".join(f"{k} {v:.1f}" for k, v in test.items() if isinstance(v, float) and "rsum" in k)
    summary = (
        f"first step {first.group(1) if first else '?'} s after start; "
        f"{len(result.get('history', []))} epochs; test {metrics or test}"
    )
    return Row(name, status, seconds, why + summary)


def check_row(name: str, title: str, root: Path, limit: float) -> Row:
    """A row of :data:`ROW_FUNCTIONS` in a subprocess: its JSON line gives the detail or the skip reason."""
    status, seconds, out = _run([sys.executable, "-m", "raydist.benchmarks.gpu", "--row", name], limit, root)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        return Row(title, status, seconds, _tail(out))
    result = json.loads(lines[-1])
    if status != "ok":
        return Row(title, status, seconds, f"{result.get('detail', '')} (then cut off: {_tail(out, 1)})")
    if "skipped" in result:
        return Row(title, "skipped", seconds, result["skipped"])
    return Row(title, "ok", seconds, result["detail"])


def report(rows: list[Row], header: str) -> str:
    """The results file: a header line and one table row per check."""
    lines = [header, "", "| check | status | seconds | result |", "|---|---|---:|---|"]
    lines += [f"| {r.name} | {r.status} | {r.seconds:.0f} | {r.detail.replace('|', '/')} |" for r in rows]
    return "\n".join(lines) + "\n"


def run_check(out_dir: Path) -> int:
    """Run every row (or say why not) and write ``out_dir/gpu_check.md``; the exit status (0 when skipped)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / RESULTS_FILE
    when = time.strftime("%Y-%m-%d %H:%M")
    reason = gpu_skip_reason()
    if reason is not None:
        results.write_text(f"GPU check skipped ({when}, {platform.node()}): {reason}.\n")
        say(f"gpu check skipped: {reason}; wrote {results}")
        return 0
    import torch

    gpus = torch.cuda.device_count()
    root = _repo_root()
    header = (
        f"GPU check, {when}: {gpus} × {torch.cuda.get_device_name(0)}, torch {torch.__version__} "
        f"(CUDA {torch.version.cuda}), python {platform.python_version()}; command: "
        f"bash bench/gpu_check.sh {out_dir}"
    )
    plan: list[tuple[float, Callable[[float], Row]]] = [
        (60, lambda s: check_tests(root, s)),
        (165, lambda s: check_train(root, out_dir, gpus, s)),
        (75, lambda s: check_row("faiss", "faiss-gpu flat and IVF", root, s)),
        (90, lambda s: check_row("loss", f"tiled MH loss, {LOSS_ROWS:,} rows", root, s)),
        (45, lambda s: check_row("images", "image encoder images/s", root, s)),
        (30, lambda s: check_row("grad-cache", "gradient caching, memory and step time", root, s)),
    ]  # limits sum to 465 s: the whole check stays under 8 minutes
    rows = []
    for limit, check in plan:
        rows.append(check(limit))
        say(report(rows[-1:], f"[{len(rows)}/{len(plan)}]"))
        results.write_text(report(rows, header))  # written after each row: a cut-off run keeps what it saw
    say(f"wrote {results}")
    return 0 if all(r.status in ("ok", "skipped") for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    """``OUT_DIR``: run the check; ``--row NAME``: one row in this process, printing its JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", help="folder for gpu_check.md (and the train run's log)")
    parser.add_argument("--row", choices=sorted(ROW_FUNCTIONS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.row:
        say(json.dumps(ROW_FUNCTIONS[args.row]()))
        return 0
    if not args.out_dir:
        parser.error("give the folder for the results file")
    return run_check(Path(args.out_dir))


if __name__ == "__main__":
    sys.exit(main())
