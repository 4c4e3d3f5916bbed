"""MH (VSE++ max of hinges) vs SH (sum of hinges) with the real distributed pipeline, side by side.

Runs `raydist.train.trainer.run_training` once per loss (same preset, data, seed and workers) and
prints the test-split metrics of each best checkpoint and the MH − SH differences.

    python bench/bench_mh_vs_sh.py --preset default [--data DIR] [key=value ...]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")

from raydist.config import load_config, parse_overrides
from raydist.train.trainer import run_training

KEYS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="default")
    parser.add_argument("--data", default="")
    parser.add_argument("--storage", default="runs/bench-mh-sh")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    rows = {}
    for name, hardest in (("MH", True), ("SH", False)):
        overrides = {**parse_overrides(args.overrides), "loss.hardest": hardest, "train.storage_path": args.storage}
        if args.data:
            overrides["data.path"] = os.path.abspath(args.data)
        t0 = time.perf_counter()
        outcome = run_training(load_config(args.preset, overrides=overrides))
        rows[name] = {**outcome.test_metrics, "seconds": time.perf_counter() - t0}
    print(f"\npreset {args.preset}, overrides {args.overrides or '-'}; test split, best checkpoint by val rsum")
    print(f"{'loss':6}" + "".join(f"{k:>9}" for k in KEYS) + f"{'wall s':>9}")
    for name, m in rows.items():
        print(f"{name:6}" + "".join(f"{m[k]:9.1f}" for k in KEYS) + f"{m['seconds']:9.0f}")
    print(f"{'MH-SH':6}" + "".join(f"{rows['MH'][k] - rows['SH'][k]:+9.1f}" for k in KEYS))


if __name__ == "__main__":
    main()
