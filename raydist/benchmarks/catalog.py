"""The benchmark suite by name: imports each benchmark module, lists its benchmark functions under their
names (:data:`BENCHMARKS`) and runs a selection of them (:func:`run_benchmarks`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from raydist.benchmarks.data import data_rate
from raydist.benchmarks.gather import gather_share
from raydist.benchmarks.gc import gc_cost
from raydist.benchmarks.grad_cache import grad_cache_memory
from raydist.benchmarks.images import images_rate
from raydist.benchmarks.loss import loss_memory, loss_time
from raydist.benchmarks.pixels_vs_vectors import pixels_vs_vectors
from raydist.benchmarks.real_cross_view import real_cross_view
from raydist.benchmarks.retrieval import retrieval
from raydist.benchmarks.serve import serve_rate
from raydist.benchmarks.startup import startup
from raydist.benchmarks.step import step_rate
from raydist.benchmarks.text import text_encoders, tokenize_rate
from raydist.benchmarks.webdataset import webdataset_rate


class BenchmarkFn(Protocol):
    """A benchmark: runs at tiny sizes once when ``smoke``, else ``repeats`` times per measurement, and
    returns its result as markdown (a line saying what was measured, then a table)."""

    def __call__(self, *, smoke: bool, repeats: int) -> str: ...


@dataclass(frozen=True)
class Benchmark:
    """A named benchmark function; ``options``: the command-line options it takes as keyword arguments (``raydist
    bench --data DIR`` → ``data``), which the others ignore; ``repeated``: whether it uses ``repeats``."""

    name: str
    run: BenchmarkFn
    options: tuple[str, ...] = ()
    repeated: bool = True

    @property
    def summary(self) -> str:
        """The first line of the function's docstring."""
        return (self.run.__doc__ or self.name).strip().splitlines()[0]


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("loss", loss_time),
        Benchmark("loss-memory", loss_memory),
        Benchmark("data", data_rate),
        Benchmark("step", step_rate),
        Benchmark("gather", gather_share),
        Benchmark("gc", gc_cost),
        Benchmark("startup", startup),
        Benchmark("retrieval", retrieval),
        Benchmark("real-cross-view", real_cross_view),
        Benchmark("text-encoders", text_encoders),
        Benchmark("tokenize", tokenize_rate),
        Benchmark("images", images_rate),
        Benchmark("pixels-vs-vectors", pixels_vs_vectors, options=("data", "in_process"), repeated=False),
        Benchmark("grad-cache", grad_cache_memory),
        Benchmark("serve", serve_rate),
        Benchmark("webdataset", webdataset_rate),
    )
}


def run_benchmarks(
    names: list[str] | None, *, smoke: bool, repeats: int, options: Mapping[str, Any] | None = None
) -> str:
    """Run the named benchmarks (all of :data:`BENCHMARKS`, in its order, for None), print each one's markdown
    as it finishes and return them all. ``smoke``: tiny sizes and one repetition. ``options``: keyword
    arguments handed to the benchmarks that name them in :attr:`Benchmark.options` (None values left out)."""
    chosen = list(BENCHMARKS) if names is None else names
    unknown = [n for n in chosen if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}: expected some of {sorted(BENCHMARKS)}")
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: expected at least 1")
    sections = []
    for name in chosen:
        benchmark = BENCHMARKS[name]
        mode = "smoke" if smoke else f"{repeats} repeats" if benchmark.repeated else "one run"
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        extra = {k: v for k, v in (options or {}).items() if k in benchmark.options and v is not None}
        body = benchmark.run(smoke=smoke, repeats=1 if smoke else repeats, **extra)
        section = (
            f"### {name} ({mode}): {benchmark.summary}\n\n"
            f"Load average (1, 5, 15 min) at its start: {load}.\n\n{body.strip()}\n"
        )
        print(section, flush=True)
        sections.append(section)
    return "\n".join(sections)
