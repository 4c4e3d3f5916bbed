"""The benchmark suite by name: a :class:`Benchmark` per benchmark function, registered by its own module with
``@register_benchmark("name")`` in :data:`BENCHMARKS` (a :class:`raydist.registry.Registry` that imports every
module of this package the first time it is read), so a new benchmark is one module here (+ its test), and a
plugin (:mod:`raydist.plugins`) registers one the same way. :func:`run_benchmarks` runs a selection; with none,
all of them in :attr:`Benchmark.order` (a new benchmark without one goes last)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from raydist.console import say
from raydist.registry import Registry


class BenchmarkFn(Protocol):
    """A benchmark: runs at tiny sizes once when ``smoke``, else ``repeats`` times per measurement, and
    returns its result as markdown (a line saying what was measured, then a table)."""

    def __call__(self, *, smoke: bool, repeats: int) -> str: ...


@dataclass(frozen=True)
class Benchmark:
    """A named benchmark function; ``options``: the command-line options it takes as keyword arguments (``raydist
    bench --data DIR`` → ``data``), which the others ignore; ``repeated``: whether it uses ``repeats``;
    ``order``: its place in ``raydist bench`` with no names (ties and unset ones by name, last); ``ray``: it runs
    on Ray (the one already started in this process, else a private one); ``aliases``: former names that still
    select it (``gc`` for ``gradclust``)."""

    name: str
    run: BenchmarkFn
    options: tuple[str, ...] = ()
    repeated: bool = True
    order: float = math.inf
    ray: bool = False
    aliases: tuple[str, ...] = ()

    @property
    def summary(self) -> str:
        """The first line of the function's docstring."""
        return (self.run.__doc__ or self.name).strip().splitlines()[0]


BENCHMARKS: Registry[Benchmark] = Registry("benchmark", package="raydist.benchmarks")


def register_benchmark(
    name: str,
    *,
    options: tuple[str, ...] = (),
    repeated: bool = True,
    order: float = math.inf,
    ray: bool = False,
    aliases: tuple[str, ...] = (),
) -> Callable[[BenchmarkFn], BenchmarkFn]:
    """Function decorator: register the function as the benchmark ``name`` (:class:`Benchmark`'s fields);
    returns the function unchanged."""

    def add(fn: BenchmarkFn) -> BenchmarkFn:
        benchmark = Benchmark(name, fn, options, repeated, order, ray, aliases)
        BENCHMARKS.register(name, benchmark, module=getattr(fn, "__module__", None))
        return fn

    return add


def benchmark_names() -> list[str]:
    """Every registered benchmark (the shipped ones and a loaded plugin's), in the order of ``raydist bench``
    with no names."""
    return sorted(BENCHMARKS.names(), key=lambda n: (BENCHMARKS.get(n).order, n))


def benchmark_name(name: str) -> str:
    """The registered name that ``name`` selects: itself, or the benchmark that has it as an alias (``gc`` →
    ``gradclust``); unknown names come back unchanged."""
    if name in BENCHMARKS:
        return name
    return next((e.name for e in BENCHMARKS.entries() if name in e.obj.aliases), name)


def run_benchmarks(
    names: list[str] | None, *, smoke: bool, repeats: int, options: Mapping[str, Any] | None = None
) -> str:
    """Run the named benchmarks (all of :func:`benchmark_names`, in its order, for None), print each one's
    markdown as it finishes and return them all. ``smoke``: tiny sizes and one repetition. ``options``: keyword
    arguments handed to the benchmarks that name them in :attr:`Benchmark.options` (None values left out)."""
    known = benchmark_names()
    chosen = known if names is None else [benchmark_name(n) for n in names]
    unknown = [n for n in chosen if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {unknown}: expected some of {sorted(known)}")
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: expected at least 1")
    sections = []
    for name in chosen:
        benchmark = BENCHMARKS.get(name)
        mode = "smoke" if smoke else f"{repeats} repeats" if benchmark.repeated else "one run"
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        extra = {k: v for k, v in (options or {}).items() if k in benchmark.options and v is not None}
        body = benchmark.run(smoke=smoke, repeats=1 if smoke else repeats, **extra)
        section = (
            f"### {name} ({mode}): {benchmark.summary}\n\n"
            f"Load average (1, 5, 15 min) at its start: {load}.\n\n{body.strip()}\n"
        )
        say(section)
        sections.append(section)
    return "\n".join(sections)
