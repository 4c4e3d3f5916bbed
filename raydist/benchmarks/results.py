"""Recording benchmark results: the command line (with the thread variables that change timings), the
machine and versions, appended with the tables to a results file (bench/RESULTS.md)."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import torch

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")  # recorded with the command


def cpu_model() -> str:
    """The CPU model name (``/proc/cpuinfo``, else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_line() -> str:
    """``CPU model, N cores; torch …, ray …, python …; YYYY-MM-DD``."""
    try:
        ray_version = metadata.version("ray")
    except metadata.PackageNotFoundError:
        ray_version = "not installed"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{cpu_model()}, {cores} cores, {torch.get_num_threads()} torch threads; torch {torch.__version__}, "
        f"ray {ray_version}, python {platform.python_version()}; {datetime.date.today().isoformat()}"
    )


def recorded_command(argv: Sequence[str]) -> str:
    """``argv`` shell-quoted, after the thread variables of :data:`THREAD_VARIABLES` that are set."""
    env = [f"{name}={os.environ[name]}" for name in THREAD_VARIABLES if name in os.environ]
    return shlex.join([*env, *argv])


def append_results(path: str | Path, command: str, table: str) -> None:
    """Append a section to the results file ``path``: heading, the command, machine and versions, the table."""
    section = (
        f"\n## Benchmark suite (raydist.benchmarks), {datetime.date.today().isoformat()}\n\n"
        f"Command:\n\n    {command}\n\nMachine: {machine_line()}\n\n{table.strip()}\n"
    )
    with Path(path).open("a", encoding="utf-8") as out:
        out.write(section)
