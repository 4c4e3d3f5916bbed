"""Benchmark of the time from ``raydist train`` to the first optimizer step ("startup"), measured the way a
user meets it: the CLI in a fresh process (imports, a private local Ray instance, the Ray Train worker group,
the dataset, the first batch, the first step), with the train split read into memory (the default) and
streamed through Ray Data (``data.in_memory_max_mb=0``), phase by phase from the marks the run itself records
(``TrainOutcome.startup``). The reference in the same run is a fresh Python importing what the CLI's training
path imports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from raydist.benchmarks.catalog import register_benchmark
from raydist.benchmarks.harness import RAY_ENV, row, spread
from raydist.config import load_config
from raydist.data import make_synthetic
from raydist.train.plan import resolve_data_dir
from raydist.train.trainer import STARTUP_PHASES

VARIANTS = {"in memory (default)": [], "streamed (`data.in_memory_max_mb=0`)": ["data.in_memory_max_mb=0"]}
IMPORTS = "import raydist.cli, raydist.train.trainer, ray.train.torch, ray.data, torch"
# the rows of the phase table: (mark, what it is); "launch" is the CLI's first line (Python's own start-up before)
PHASES = (
    ("launch", "Python started (the CLI's first line)"),
    ("imports", "imports done (torch, pyarrow, raydist)"),
    ("data_checked", "data checked (every refusal made; Ray not started yet)"),
    ("ray_ready", "Ray ready (private local instance up)"),
    ("workers_started", "workers started (rank 0's train function begins: Ray Train's worker group is up)"),
    ("data_ready", "data ready (rank 0 read its train split, or opened its stream)"),
    ("first_step", "first optimizer step"),
)
assert [key for key, _ in PHASES[1:]] == [key for key, _ in STARTUP_PHASES]


def _env() -> dict[str, str]:
    """The subprocess environment: this one plus Ray's quiet settings (each run starts its own instance)."""
    env = {**RAY_ENV, **os.environ}
    env.pop("RAY_ADDRESS", None)
    return env


def run_cli(args: list[str], out: Path, env: dict[str, str]) -> tuple[dict[str, float], float, float | None]:
    """``raydist train ARGS --json OUT`` in a fresh process: (seconds from launch to each start-up mark the run
    recorded, :data:`PHASES`; ``first_step`` always), seconds of the whole run, the Ray start-up the CLI
    reported or None in-process)."""
    launched = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "raydist.cli", "train", *args, "--json", str(out)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    total = time.time() - launched
    if done.returncode != 0:
        raise RuntimeError(f"raydist train failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    outcome = json.loads(out.read_text())
    if outcome.get("first_step_unix") is None:
        raise RuntimeError(f"raydist train ran no optimizer step; output:\n{done.stdout[-2000:]}")
    marks = {key: t - launched for key, t in (outcome.get("startup") or {}).items() if t is not None}
    marks["first_step"] = outcome["first_step_unix"] - launched
    ray_start = re.search(r"Ray ready in ([0-9.]+) s", done.stdout)
    return marks, total, float(ray_start.group(1)) if ray_start else None


def import_seconds(env: dict[str, str]) -> float:
    """Seconds of a fresh Python importing :data:`IMPORTS`."""
    launched = time.time()
    subprocess.run([sys.executable, "-c", IMPORTS], env=env, check=True, capture_output=True)
    return time.time() - launched


@register_benchmark("startup", order=7)
def startup(*, smoke: bool, repeats: int) -> str:
    """Seconds from launching `raydist train` to its first optimizer step, phase by phase, train split in memory
    vs streamed."""
    env = _env()
    runs = 1 if smoke else repeats
    with tempfile.TemporaryDirectory(prefix="raydist-bench-startup-") as tmp:
        common = ["train.epochs=1", "train.min_steps=0", f"train.storage_path={tmp}/runs"]
        variants = VARIANTS
        if smoke:  # the code path only: in-process (no Ray start), one variant
            data = make_synthetic(
                Path(tmp) / "data",
                images=60,
                captions_per_image=2,
                dim=16,
                seed=0,
                val_images=8,
                test_images=8,
            )
            common += ["--preset", "tiny", "--data", str(data)]
            variants = {"in memory, in-process (`train.num_workers=0`)": ["train.num_workers=0"]}
            what = "the `tiny` preset on a 60-image synthetic set"
        else:
            data = resolve_data_dir(load_config("default"))  # generated once now, not inside a timed run
            what = "the `default` preset on the embedded dataset (cached), each run starting its own Ray instance"
        imports: list[float] = []
        marks: dict[str, dict[str, list[float]]] = {name: {key: [] for key, _ in PHASES} for name in variants}
        total: dict[str, list[float]] = {name: [] for name in variants}
        ray: dict[str, list[float]] = {name: [] for name in variants}
        for i in range(runs):  # interleaved: load from other processes hits every variant alike
            imports.append(import_seconds(env))
            for name, extra in variants.items():
                seen, t, r = run_cli([*common, *extra], Path(tmp) / f"out-{i}-{len(extra)}.json", env)
                for key, seconds in seen.items():
                    marks[name].setdefault(key, []).append(seconds)
                total[name].append(t)
                if r is not None:
                    ray[name].append(r)
    s = "{:.2f}"
    names = list(variants)
    table = [
        row("launch → …, seconds (median (min–max))", *(f"train split {name}" for name in names)),
        "|---|" + "---:|" * len(names),
        row(
            f"imports alone, a fresh `python -c '{IMPORTS}'` (reference)",
            *([spread(imports, s)] * len(names)),
        ),
    ]
    for key, title in PHASES:
        cells = [spread(marks[name][key], s) if marks[name][key] else "—" for name in names]
        table.append(row(f"**{title}**" if key == "first_step" else title, *cells))
    table.append(
        row(
            "of which Ray's own start (the CLI's \"Ray ready in\")",
            *(spread(ray[name], s) if ray[name] else "— (no Ray)" for name in names),
        )
    )
    table.append(row("whole 1-epoch run", *(spread(total[name], "{:.1f}") for name in names)))
    return (
        f"`raydist train train.epochs=1 train.min_steps=0` as a subprocess ({what}); each row is the median over "
        "the runs of the seconds from launching the subprocess to a mark the run records (its `--json` outcome: "
        "`startup`, from the CLI and rank 0, and `first_step_unix`, the wall clock rank 0 reads when its first "
        "optimizer step ends). The marks come in this order in every run; a phase's cost is the difference "
        f"between its row and the row above. {runs} interleaved run(s) per column.\n\n" + "\n".join(table)
    )
