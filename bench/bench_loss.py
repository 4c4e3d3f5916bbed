"""Ranking-loss benchmarks ("loss", "loss-memory") of raydist.benchmarks, optionally appended to
bench/RESULTS.md.

    python bench/bench_loss.py [NAME ...] [--repeats 5] [--smoke] [--record]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from raydist.benchmarks import append_results, run_benchmarks

RESULTS = Path(__file__).with_name("RESULTS.md")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS")  # recorded with the command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=["loss", "loss-memory"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition")
    parser.add_argument("--record", action="store_true", help=f"append the tables to {RESULTS}")
    args = parser.parse_args()
    table = run_benchmarks(args.names, smoke=args.smoke, repeats=args.repeats)
    if args.record:
        env = [f"{name}={os.environ[name]}" for name in THREAD_VARIABLES if name in os.environ]
        append_results(RESULTS, shlex.join([*env, "python", "bench/bench_loss.py", *sys.argv[1:]]), table)


if __name__ == "__main__":
    main()
