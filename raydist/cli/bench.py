"""``raydist bench``: benchmarks side by side with their references (:mod:`raydist.benchmarks`)."""

from __future__ import annotations

import argparse
import sys

from raydist.cli.common import Command
from raydist.console import say


class _BenchmarkNames:
    """The registered benchmarks' names, read when a help text is printed (building the parser imports no
    benchmark)."""

    def __str__(self) -> str:
        from raydist.benchmarks import benchmark_names

        return ", ".join(benchmark_names())


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``raydist bench``."""
    names = p.add_argument("names", nargs="*", help="benchmarks to run: %(known)s (default: all)")
    names.known = _BenchmarkNames()  # type: ignore[attr-defined]  -- the help's %(known)s
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition (what the tests run)")
    p.add_argument("--repeats", type=int, default=5, help="repetitions per measurement (median and spread)")
    p.add_argument(
        "--data",
        help="pixels-vs-vectors: an encoded-image dataset folder (task labels or pairs; "
        "default: scikit-learn's digits as PNGs); the other benchmarks ignore it",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="pixels-vs-vectors: train in process with one torch "
        "thread (train.num_workers=0) instead of the Ray Train workers `raydist train` starts",
    )
    p.add_argument(
        "--full",
        action="store_true",
        help="step: the long form (a fresh Ray fit and fresh reference processes per repeat, 218-step epochs, "
        "diagnostic rows; over 10 min on 2 cores) instead of the quick default (per worker count one Ray run "
        "and one reference taking turns over --repeats pairs of 60-step windows; under 3 min); the other "
        "benchmarks ignore it",
    )
    p.add_argument("--record", help="append the table with command, machine and versions to this file")


def run(args: argparse.Namespace) -> int:
    """Run the named benchmarks (all without names) and optionally append the table to a results file."""
    from raydist.benchmarks import append_results, recorded_command, run_benchmarks

    table = run_benchmarks(
        args.names or None,
        smoke=args.smoke,
        repeats=args.repeats,
        options={"data": args.data, "in_process": args.in_process, "full": args.full},
    )
    if args.record:
        append_results(args.record, recorded_command(["raydist", "bench", *sys.argv[2:]]), table)
        say(f"appended to {args.record}")
    return 0


BENCH = Command(
    "bench", "run benchmarks side by side with their references (table + ratios)", add_arguments, run
)
