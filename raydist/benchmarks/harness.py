"""What the data, step and gather benchmarks share: a Ray instance for the length of a benchmark (the one
already running, else a private one that is shut down after), the default preset's pairs task on a
synthetic dataset, the training step's parts, and table cells (median, spread, ratio, target held)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from raydist.config import Config, load_config
from raydist.distributed import StepPlan
from raydist.tasks import DataInfo, Task, build_task
from raydist.train.plan import step_plan

# Ray's environment for a benchmark process, set before Ray is imported (quiet, no auth on a private instance).
# Not the test suite's RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.5 (faster fits, but the controller polls the workers
# 4× as often): benchmarks time what `raydist train` runs, with Ray Train's default interval.
RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS": "1",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "60",
    "RAY_USAGE_STATS_ENABLED": "0",
}
LOGICAL_CPUS = 4  # scheduling tokens of a private instance: train workers + Ray Data fit on a 2-core box


@contextmanager
def ray_instance() -> Iterator[None]:
    """The Ray instance this process already has, else a private local one for the ``with`` block."""
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    import ray

    from raydist.runtime import start_local_ray

    if ray.is_initialized():
        yield
        return
    start_local_ray(LOGICAL_CPUS, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def pairs_setup(
    data_dir: str | Path, overrides: dict[str, object] | None = None
) -> tuple[Config, Task, StepPlan]:
    """The ``default`` preset (plus ``overrides``) on ``data_dir``: config, pairs task and step plan."""
    cfg = load_config("default", overrides={"data.path": str(data_dir), **(overrides or {})})
    task = build_task(cfg, DataInfo.from_dataset(data_dir))
    return cfg, task, step_plan(cfg, task.info.task)


def seconds(fn: Callable[[], object]) -> float:
    """Wall seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    """``median (min–max)`` of ``values``, each formatted with ``fmt``."""
    return f"{fmt.format(median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def ms_spread(times: list[float], fmt: str = "{:.2f}") -> str:
    """``median (min–max)`` of times in seconds, shown in milliseconds."""
    return spread([t * 1e3 for t in times], fmt)


def row(*cells: object) -> str:
    """A markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def held(ok: bool) -> str:
    return "yes" if ok else "**no**"


def omp_wait_policy() -> str:
    return os.environ.get("OMP_WAIT_POLICY", "unset")
