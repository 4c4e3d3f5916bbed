"""Which hooks a run gets, from its config: the one place that wires the hooks (above every hook module, so
the hooks never import it)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from raydist.config import Config
from raydist.gradclust.hook import GradientClusteringHook
from raydist.runfiles import STOP_FILE
from raydist.tasks import Task
from raydist.train.faults import FailAtStep, SlowSteps
from raydist.train.hooks import Hook, ValidationHook
from raydist.train.stopping import StopFileHook
from raydist.train.tracking import TrackingHook


def build_hooks(
    cfg: Config, task: Task, runtime: Any, run_dir: str | None, stop_file: str | None = None
) -> list[Hook]:
    """The hooks of a run: gradient clustering (``gc.measure`` / ``gc.sample``), validation, fault injection
    when ``debug.fail_at_step`` / ``debug.step_delay_s`` ask for it, tracking (after the others: it logs the
    metrics they add) and, with a local run folder, the stop file the driver writes on SIGINT/SIGTERM.
    ``runtime``: the loop's runtime (device, rank, world, in-memory ``arrays`` or None, ``plan``);
    ``run_dir``: the local run folder, None on remote storage; ``stop_file``: where the driver writes its stop
    file (default: in ``run_dir``; a URI for a run folder on object storage)."""
    hooks: list[Hook] = [ValidationHook(task, runtime.device)]
    if cfg.gc.measure or cfg.gc.sample:
        hooks.insert(
            0,
            GradientClusteringHook(
                cfg,
                task,
                runtime.arrays,
                rank=runtime.rank,
                world=runtime.world,
                rows=runtime.plan.rows_per_worker,
                device=runtime.device,
            ),
        )
    if cfg.debug.fail_at_step >= 0:
        marker = run_dir or tempfile.gettempdir()
        hooks.insert(0, FailAtStep(cfg.debug.fail_at_step, cfg.debug.fail_rank, marker))
    if cfg.debug.step_delay_s > 0:
        hooks.insert(0, SlowSteps(cfg.debug.step_delay_s))
    hooks.append(TrackingHook(cfg, run_dir))
    if stop_file is None and run_dir is not None:
        stop_file = str(Path(run_dir) / STOP_FILE)
    if stop_file is not None:  # the driver writes this file on SIGINT/SIGTERM (raydist.train.stopping)
        hooks.append(StopFileHook(stop_file))
    return hooks
