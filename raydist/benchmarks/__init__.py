"""raydist.benchmarks: a registry of named benchmarks (one ``@register_benchmark`` function each, in any
module of this package), :func:`run_benchmarks` and :func:`append_results` (bench/RESULTS.md)."""

from raydist.benchmarks.registry import (
    BENCHMARKS,
    Benchmark,
    append_results,
    register_benchmark,
    registered_benchmarks,
    run_benchmarks,
)

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "append_results",
    "register_benchmark",
    "registered_benchmarks",
    "run_benchmarks",
]
