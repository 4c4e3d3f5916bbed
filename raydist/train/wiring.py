"""Which hooks a run gets, from its config: the shipped hooks' factories, registered in the hook registry
(:data:`raydist.train.hooks.HOOKS`) where a plugin registers its own; above every hook module, so the hooks
never import it."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from raydist.config import Config
from raydist.runfiles import STOP_FILE
from raydist.tasks import Task
from raydist.train.corpus_negatives import CorpusNegativesHook
from raydist.train.faults import FailAtStep, SlowSteps
from raydist.train.gradclust_hook import GradientClusteringHook
from raydist.train.hooks import Hook, HookSite, ValidationHook, register_hook, registered_hooks
from raydist.train.stopping import StopFileHook
from raydist.train.tracking import TrackingHook


@register_hook("slow-steps", order=0)
def _slow_steps(site: HookSite) -> Hook | None:
    """``debug.step_delay_s`` > 0: every worker sleeps before each step (a slow run for drills)."""
    delay = site.cfg.debug.step_delay_s
    return SlowSteps(delay) if delay > 0 else None


@register_hook("fail-at-step", order=10)
def _fail_at_step(site: HookSite) -> Hook | None:
    """``debug.fail_at_step`` >= 0: worker ``debug.fail_rank`` exits hard once at that step."""
    d = site.cfg.debug
    if d.fail_at_step < 0:
        return None
    return FailAtStep(d.fail_at_step, d.fail_rank, site.run_dir or tempfile.gettempdir())


@register_hook("gradient-clustering", order=20)
def _gradient_clustering(site: HookSite) -> Hook | None:
    """``gc.measure`` / ``gc.sample``: GC statistics, the variance meter, stratified batches."""
    cfg, runtime = site.cfg, site.runtime
    if not (cfg.gc.measure or cfg.gc.sample):
        return None
    return GradientClusteringHook(
        cfg,
        site.task,
        runtime.arrays,
        rank=runtime.rank,
        world=runtime.world,
        rows=runtime.plan.rows_per_worker,
        device=runtime.device,
    )


@register_hook("corpus-negatives", order=25)
def _corpus_negatives(site: HookSite) -> Hook | None:
    """``loss.mined_negatives`` > 0: the train split mined for hard negatives every ``loss.mine_every`` steps (in
    this process without Ray Train workers, else by a Ray actor beside them)."""
    kind, runtime = site.task.loss_fn, site.runtime
    if kind is None or not kind.mined_negatives(site.cfg):
        return None
    beside = site.cfg.train.num_workers > 0  # Ray Train workers: a Ray actor mines beside them
    return CorpusNegativesHook(
        site.cfg, site.task, runtime.arrays, runtime.device, runtime.rank, beside=beside
    )


@register_hook("validation", order=30)
def _validation(site: HookSite) -> Hook:
    """Rank 0 evaluates the val split after every epoch."""
    return ValidationHook(site.task, site.runtime.device)


@register_hook("tracking", order=90)
def _tracking(site: HookSite) -> Hook:
    """History, progress, TensorBoard/MLflow (after the others: it logs the metrics they add)."""
    return TrackingHook(site.cfg, site.run_dir)


@register_hook("stop-file", order=100)
def _stop_file(site: HookSite) -> Hook | None:
    """With a run folder (or a stop-file URI): the file the driver writes on SIGINT/SIGTERM ends the run."""
    stop_file = site.stop_file
    if stop_file is None and site.run_dir is not None:
        stop_file = str(Path(site.run_dir) / STOP_FILE)
    return StopFileHook(stop_file) if stop_file is not None else None


def build_hooks(
    cfg: Config, task: Task, runtime: Any, run_dir: str | None, stop_file: str | None = None
) -> list[Hook]:
    """The hooks of a run (:func:`raydist.train.hooks.registered_hooks`): the shipped ones above -- fault
    injection, gradient clustering, validation, tracking, the stop file -- and any a plugin registers.
    ``runtime``: the loop's runtime (device, rank, world, in-memory ``arrays`` or None, ``plan``);
    ``run_dir``: the local run folder, None on remote storage; ``stop_file``: where the driver writes its stop
    file (default: in ``run_dir``; a URI for a run folder on object storage)."""
    return registered_hooks(HookSite(cfg, task, runtime, run_dir, stop_file))
