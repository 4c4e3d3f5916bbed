"""Cost of gradient clustering: step time with GC statistics on vs off (W = 1 and W = 2) and the memory GC
adds. A thin wrapper of the suite's ``gc`` benchmark (raydist/benchmarks/gc.py), the same as

    raydist bench gc [--smoke] [--repeats N] [--record bench/RESULTS.md]

    python bench/bench_gc.py [--smoke] [--repeats N]
"""

from __future__ import annotations

import argparse

from raydist.benchmarks import run_benchmarks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model, batches 16 and 32, 20 steps")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps of each kind = 40 × repeats")
    args = parser.parse_args()
    run_benchmarks(["gc"], smoke=args.smoke, repeats=args.repeats)


if __name__ == "__main__":
    main()
