"""The benchmark registry: named benchmarks, running a selection of them, and appending their tables with
the machine and versions to bench/RESULTS.md."""

from __future__ import annotations

import datetime
import importlib
import os
import pkgutil
import platform
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Protocol

import torch


class BenchmarkFn(Protocol):
    """A benchmark: runs at tiny sizes once when ``smoke``, else ``repeats`` times per measurement, and
    returns its result as markdown (a line saying what was measured, then a table)."""

    def __call__(self, *, smoke: bool, repeats: int) -> str: ...


@dataclass(frozen=True)
class Benchmark:
    name: str
    run: BenchmarkFn
    summary: str  # the first line of the function's docstring


BENCHMARKS: dict[str, Benchmark] = {}


def register_benchmark(name: str) -> Callable[[BenchmarkFn], BenchmarkFn]:
    """Decorator: add a benchmark function to :data:`BENCHMARKS` under ``name``.

    Any module of the ``raydist.benchmarks`` package is imported by :func:`registered_benchmarks`, so a new
    benchmark is one decorated function in a module there.
    """

    def register(fn: BenchmarkFn) -> BenchmarkFn:
        if name in BENCHMARKS:
            raise ValueError(f"benchmark {name!r} is already registered")
        BENCHMARKS[name] = Benchmark(name, fn, (fn.__doc__ or name).strip().splitlines()[0])
        return fn

    return register


def registered_benchmarks() -> dict[str, Benchmark]:
    """Import every module of ``raydist.benchmarks`` (each registers its benchmarks); the registry."""
    package = importlib.import_module("raydist.benchmarks")
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")
    return BENCHMARKS


def run_benchmarks(names: list[str] | None, *, smoke: bool, repeats: int) -> str:
    """Run the named benchmarks (all registered ones, in registration order, for None), print each one's
    markdown as it finishes and return them all. ``smoke``: tiny sizes and one repetition."""
    benchmarks = registered_benchmarks()
    chosen = list(benchmarks) if names is None else names
    unknown = [n for n in chosen if n not in benchmarks]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}: expected some of {sorted(benchmarks)}")
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: expected at least 1")
    sections = []
    for name in chosen:
        mode = "smoke" if smoke else f"{repeats} repeats"
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        body = benchmarks[name].run(smoke=smoke, repeats=1 if smoke else repeats)
        section = (
            f"### {name} ({mode}): {benchmarks[name].summary}\n\n"
            f"Load average (1, 5, 15 min) at its start: {load}.\n\n{body.strip()}\n"
        )
        print(section, flush=True)
        sections.append(section)
    return "\n".join(sections)


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


def append_results(path: str | Path, command: str, table: str) -> None:
    """Append a section to the results file ``path``: heading, the command, machine and versions, the table."""
    section = (
        f"\n## Benchmark suite (raydist.benchmarks), {datetime.date.today().isoformat()}\n\n"
        f"Command:\n\n    {command}\n\nMachine: {machine_line()}\n\n{table.strip()}\n"
    )
    with Path(path).open("a", encoding="utf-8") as out:
        out.write(section)
