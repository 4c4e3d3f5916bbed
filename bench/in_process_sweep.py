"""Wall time of a 4-trial sweep of the `tiny` preset (margin grid, 2 trials at once, 2 epochs each) whose trials
train with one Ray Train worker each, then in process (train.num_workers=0), on one local Ray with 4 logical CPUs;
prints each sweep's time and its trials' best val rsum (the same for both when the loop is the same).

    python bench/in_process_sweep.py 1 0     # worker counts to run, in order
"""

import sys
import tempfile
import time
from pathlib import Path

from raydist.data import make_synthetic
from raydist.runtime import start_local_ray
from raydist.tune.space import parse_space, resolve_base_config
from raydist.tune.sweep import run_sweep


def main(worker_counts: list[int]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="raydist-bench-sweep-"))
    data = make_synthetic(
        tmp / "tiny", images=400, captions_per_image=5, dim=32, seed=3, val_images=100, test_images=100
    )
    start_local_ray(4, log_to_driver=False)
    for workers in worker_counts:
        space = parse_space(
            {
                "search": "grid",
                "scheduler": {"type": "fifo"},
                "max_concurrent_trials": 2,
                "resources": {
                    "trial_cpus": 0.5,
                    "num_workers": workers,
                    "cpus_per_worker": 0.5 if workers else 1,
                },
                "base": {"train.epochs": 2, "train.log_every": 1000},
                "space": {"loss.margin": {"grid": [0.1, 0.2, 0.3, 0.4]}},
            },
            name=f"w{workers}",
        )
        cfg = resolve_base_config(space, preset="tiny", overrides={"data.path": str(data)})
        started = time.perf_counter()
        outcome = run_sweep(space, cfg, storage_path=str(tmp / f"tune{workers}"))
        wall = time.perf_counter() - started
        best = sorted((r.values["loss.margin"], round(r.metric, 2)) for r in outcome.rows)
        print(
            f"train.num_workers={workers}: {wall:.1f} s; (margin, best val rsum) per trial: {best}",
            flush=True,
        )


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 0])
