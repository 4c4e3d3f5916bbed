"""The benchmark suite by name: imports each benchmark module, lists its benchmark functions under their
names (:data:`BENCHMARKS`) and runs a selection of them (:func:`run_benchmarks`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from raydist.benchmarks.data import data_rate
from raydist.benchmarks.gather import gather_share
from raydist.benchmarks.gc import gc_cost
from raydist.benchmarks.images import images_rate
from raydist.benchmarks.loss import loss_memory, loss_time
from raydist.benchmarks.real_cross_view import real_cross_view
from raydist.benchmarks.retrieval import retrieval
from raydist.benchmarks.startup import startup
from raydist.benchmarks.step import step_rate
from raydist.benchmarks.text import text_encoders, tokenize_rate


class BenchmarkFn(Protocol):
    """A benchmark: runs at tiny sizes once when ``smoke``, else ``repeats`` times per measurement, and
    returns its result as markdown (a line saying what was measured, then a table)."""

    def __call__(self, *, smoke: bool, repeats: int) -> str: ...


@dataclass(frozen=True)
class Benchmark:
    """A named benchmark function."""

    name: str
    run: BenchmarkFn

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
    )
}


def run_benchmarks(names: list[str] | None, *, smoke: bool, repeats: int) -> str:
    """Run the named benchmarks (all of :data:`BENCHMARKS`, in its order, for None), print each one's markdown
    as it finishes and return them all. ``smoke``: tiny sizes and one repetition."""
    chosen = list(BENCHMARKS) if names is None else names
    unknown = [n for n in chosen if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}: expected some of {sorted(BENCHMARKS)}")
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: expected at least 1")
    sections = []
    for name in chosen:
        benchmark = BENCHMARKS[name]
        mode = "smoke" if smoke else f"{repeats} repeats"
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        body = benchmark.run(smoke=smoke, repeats=1 if smoke else repeats)
        section = (
            f"### {name} ({mode}): {benchmark.summary}\n\n"
            f"Load average (1, 5, 15 min) at its start: {load}.\n\n{body.strip()}\n"
        )
        print(section, flush=True)
        sections.append(section)
    return "\n".join(sections)
