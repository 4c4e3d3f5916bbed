"""Benchmark of the time from ``raydist train`` to the first optimizer step ("startup"), measured the way a
user meets it: the CLI in a fresh process (imports, a private local Ray instance, the Ray Train worker group,
the dataset, the first batch, the first step), with the train split read into memory (the default) and
streamed through Ray Data (``data.in_memory_max_mb=0``). The reference in the same run is a fresh Python
importing what the CLI's training path imports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from raydist.benchmarks.harness import RAY_ENV, row, spread
from raydist.config import load_config
from raydist.data import make_synthetic
from raydist.train.trainer import resolve_data_dir

VARIANTS = {"in memory (default)": [], "streamed (`data.in_memory_max_mb=0`)": ["data.in_memory_max_mb=0"]}
IMPORTS = "import raydist.cli, raydist.train.trainer, ray.train.torch, ray.data, torch"


def _env() -> dict[str, str]:
    """The subprocess environment: this one plus Ray's quiet settings (each run starts its own instance)."""
    env = {**RAY_ENV, **os.environ}
    env.pop("RAY_ADDRESS", None)
    return env


def run_cli(args: list[str], out: Path, env: dict[str, str]) -> tuple[float, float, float | None]:
    """``raydist train ARGS --json OUT`` in a fresh process: (seconds from launch to the end of the first
    optimizer step, seconds of the whole run, the Ray start-up the CLI reported or None in-process)."""
    launched = time.time()
    done = subprocess.run([sys.executable, "-m", "raydist.cli", "train", *args, "--json", str(out)],
                          check=False, env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    total = time.time() - launched
    if done.returncode != 0:
        raise RuntimeError(f"raydist train failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    first = json.loads(out.read_text()).get("first_step_unix")
    if first is None:
        raise RuntimeError(f"raydist train ran no optimizer step; output:\n{done.stdout[-2000:]}")
    ray_start = re.search(r"Ray ready in ([0-9.]+) s", done.stdout)
    return first - launched, total, float(ray_start.group(1)) if ray_start else None


def import_seconds(env: dict[str, str]) -> float:
    """Seconds of a fresh Python importing :data:`IMPORTS`."""
    launched = time.time()
    subprocess.run([sys.executable, "-c", IMPORTS], env=env, check=True, capture_output=True)
    return time.time() - launched


def startup(*, smoke: bool, repeats: int) -> str:
    """Seconds from launching `raydist train` to its first optimizer step, train split in memory vs streamed."""
    env = _env()
    runs = 1 if smoke else repeats
    with tempfile.TemporaryDirectory(prefix="raydist-bench-startup-") as tmp:
        common = ["train.epochs=1", "train.min_steps=0", f"train.storage_path={tmp}/runs"]
        variants = VARIANTS
        if smoke:  # the code path only: in-process (no Ray start), one variant
            data = make_synthetic(Path(tmp) / "data", images=60, captions_per_image=2, dim=16, seed=0,
                                  val_images=8, test_images=8)  # fmt: skip
            common += ["--preset", "tiny", "--data", str(data)]
            variants = {"in memory, in-process (`train.num_workers=0`)": ["train.num_workers=0"]}
            what = "the `tiny` preset on a 60-image synthetic set"
        else:
            data = resolve_data_dir(load_config("default"))  # generated once now, not inside a timed run
            what = "the `default` preset on the embedded dataset (cached), each run starting its own Ray instance"
        imports: list[float] = []
        first: dict[str, list[float]] = {name: [] for name in variants}
        total: dict[str, list[float]] = {name: [] for name in variants}
        ray: dict[str, list[float]] = {name: [] for name in variants}
        for i in range(runs):  # interleaved: load from other processes hits every variant alike
            imports.append(import_seconds(env))
            for name, extra in variants.items():
                f, t, r = run_cli([*common, *extra], Path(tmp) / f"out-{i}-{len(extra)}.json", env)
                first[name].append(f)
                total[name].append(t)
                if r is not None:
                    ray[name].append(r)
    s = "{:.2f}"
    table = [
        row("launch → …", "seconds, median (min–max)", "of which Ray start (CLI's \"Ray ready in\")",
            "whole 1-epoch run (s)"),
        "|---|---:|---:|---:|",
        row(f"imports done (`python -c '{IMPORTS}'`, reference)", spread(imports, s), "", ""),
    ]
    for name, seconds in first.items():
        started = spread(ray[name], s) if ray[name] else "— (no Ray)"
        table.append(row(f"first optimizer step, train split {name}", spread(seconds, s), started,
                         spread(total[name], "{:.1f}")))  # fmt: skip
    return (
        f"`raydist train train.epochs=1 train.min_steps=0` as a subprocess ({what}); the first optimizer step's "
        "time is the wall clock rank 0 records when that step finishes (the run's `--json` outcome, "
        "`first_step_unix`), minus the launch time. It covers Python start-up, imports, Ray, the Ray Train worker "
        f"group, opening the dataset, the first batch and the first step. {runs} interleaved run(s) per row.\n\n"
        + "\n".join(table)
    )
