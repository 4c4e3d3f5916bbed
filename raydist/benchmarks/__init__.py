"""raydist.benchmarks: the benchmark suite of ``raydist bench``, one function per benchmark in the modules of
this package, listed by name in :mod:`raydist.benchmarks.catalog`; :func:`run_benchmarks` and
:func:`append_results` (bench/RESULTS.md). Modules of this package import each other by their full module
names, never through this package."""

from raydist.benchmarks.catalog import BENCHMARKS, Benchmark, run_benchmarks
from raydist.benchmarks.results import append_results, recorded_command

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "append_results",
    "recorded_command",
    "run_benchmarks",
]
