"""raydist.benchmarks: the benchmark suite of ``raydist bench``, one function per benchmark in the modules of
this package, each registered by its module (``@register_benchmark``) in :data:`BENCHMARKS`
(:mod:`raydist.benchmarks.catalog`, which finds the modules); :func:`run_benchmarks` and
:func:`append_results` (bench/RESULTS.md). Modules of this package import each other by their full module
names, never through this package."""

from raydist.benchmarks.catalog import (
    BENCHMARKS,
    Benchmark,
    benchmark_name,
    benchmark_names,
    register_benchmark,
    run_benchmarks,
)
from raydist.benchmarks.results import append_results, recorded_command

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "append_results",
    "benchmark_name",
    "benchmark_names",
    "recorded_command",
    "register_benchmark",
    "run_benchmarks",
]
