"""Experiment tracking on rank 0: TensorBoard event files and ``steps.jsonl`` in the run folder, and an
MLflow run when ``train.mlflow_uri`` is set. Per-step scalars every ``train.log_every`` steps; every
numeric epoch metric (train/*, val/*, ...) at the end of each epoch."""

from __future__ import annotations

import importlib.util
import json
import os
import time
import weakref
from pathlib import Path
from typing import Any

from torch import nn

from raydist.config import Config, ConfigError, is_finite_number
from raydist.console import say
from raydist.runfiles import STEPS_FILE
from raydist.tasks import StepContext
from raydist.train.hooks import Hook

AXES = ("epoch", "step")  # metrics entries that are the x axis, not scalars to log
MLFLOW_BATCH = 100  # MLflow accepts at most 100 params per log_batch call


class TrackingHook(Hook):
    """Logs scalars against the global step (steps done, as ``step`` in history.json).

    Per step (every ``train.log_every``): TensorBoard tags ``step/loss``, ``step/world`` and ``step/<stat>``
    (e.g. ``step/neg/hardest_sim``) and one ``steps.jsonl`` line ``{"step", "epoch", "world", "time", "loss",
    "stats"}`` (epoch 1-based, as in history.json; ``world``: the workers that ran the step, which changes when
    an elastic run resizes; ``time``: ``time.time()`` at the step's end; the pairs task's stats carry the global
    batch and negative set the step used, ``neg/queries`` and ``neg/keys``). Per epoch: the epoch's metrics
    get ``world`` too (so history.json shows a resize), and every finite numeric metric is logged under its own
    name. TensorBoard files need ``train.tensorboard``; ``steps.jsonl`` is always written (plots read it).

    ``run_dir`` None (the run folder is on remote storage such as s3://): no event files and no
    ``steps.jsonl``, a note says so; MLflow still logs. A run that continues from a checkpoint first drops
    what the interrupted attempt logged after it: ``steps.jsonl`` lines past the restored step, and the same
    steps in TensorBoard (``purge_step``).
    """

    def __init__(self, cfg: Config, run_dir: str | Path | None) -> None:
        if cfg.train.mlflow_uri and importlib.util.find_spec("mlflow") is None:
            raise ConfigError(
                f"train.mlflow_uri={cfg.train.mlflow_uri!r} needs MLflow, which is not installed: "
                "pip install mlflow, or leave train.mlflow_uri empty"
            )
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir else None
        self.started = False
        self.writer: Any = None  # tensorboardX SummaryWriter
        self.mlflow: tuple[Any, str] | None = None  # (MlflowClient, run id)

    def after_step(self, ctx: StepContext, loss: float, stats: dict[str, float]) -> None:
        if ctx.rank != 0:
            return
        self._start(ctx.global_step)
        step = ctx.global_step + 1
        if step % self.cfg.train.log_every:
            return
        if self.run_dir is not None:
            line = {
                "step": step,
                "epoch": ctx.epoch + 1,
                "world": ctx.world,
                "time": round(time.time(), 3),
                "loss": loss,
                "stats": stats,
            }
            with (self.run_dir / STEPS_FILE).open("a") as f:
                f.write(json.dumps(line) + "\n")
        self._log(
            {"step/loss": loss, "step/world": ctx.world, **{f"step/{k}": v for k, v in stats.items()}}, step
        )

    def end_of_epoch(self, ctx: StepContext, model: nn.Module, metrics: dict[str, Any]) -> None:
        if ctx.rank != 0:
            return
        metrics.setdefault("world", ctx.world)
        self._start(ctx.global_step)
        self._log({k: v for k, v in metrics.items() if k not in AXES}, ctx.global_step)
        if self.writer is not None:
            self.writer.flush()

    def _start(self, done: int) -> None:
        """Open the sinks at the first event of this attempt; ``done``: global steps done before it."""
        if self.started:
            return
        self.started = True
        if self.run_dir is None:
            say(
                "[raydist] note: the run folder is on remote storage: no TensorBoard files or steps.jsonl "
                "(train.mlflow_uri logs anywhere)"
            )
        else:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            _drop_steps_after(self.run_dir / STEPS_FILE, done)
            if self.cfg.train.tensorboard:
                from tensorboardX import SummaryWriter

                # tensorboardX names files by the second and truncates a same-named one: the suffix keeps
                # a quick restart's file apart (and sorted after the attempt it continues)
                self.writer = SummaryWriter(
                    str(self.run_dir), purge_step=done + 1, flush_secs=30, filename_suffix=f".step{done:09d}"
                )
                weakref.finalize(self, self.writer.close)
        if self.cfg.train.mlflow_uri:
            self.mlflow = _start_mlflow_run(self.cfg, self.run_dir.name if self.run_dir else None)
            weakref.finalize(self, self.mlflow[0].set_terminated, self.mlflow[1])

    def _log(self, values: dict[str, Any], step: int) -> None:
        """Send the finite numbers of ``values`` to TensorBoard and MLflow at ``step``."""
        scalars = {k: float(v) for k, v in values.items() if is_finite_number(v)}
        if self.writer is not None:
            for tag, value in scalars.items():
                self.writer.add_scalar(tag, value, step)
        if self.mlflow is not None:
            from mlflow.entities import Metric

            client, run_id = self.mlflow
            now = int(time.time() * 1000)
            client.log_batch(run_id, metrics=[Metric(k, v, now, step) for k, v in scalars.items()])


def _drop_steps_after(path: Path, done: int) -> None:
    """Keep only the ``steps.jsonl`` lines of steps up to ``done`` (a fresh run keeps none)."""
    if not path.is_file():
        return
    kept = [
        line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= done
    ]
    path.write_text("".join(line + "\n" for line in kept))


def _start_mlflow_run(cfg: Config, run_name: str | None) -> tuple[Any, str]:
    """A new MLflow run in experiment ``$MLFLOW_EXPERIMENT_NAME`` (default "raydist"), config as params."""
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=cfg.train.mlflow_uri)
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "raydist"
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
    run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
    params = [
        Param(k, json.dumps(v) if isinstance(v, (list, dict)) else str(v)) for k, v in cfg.flat().items()
    ]
    for i in range(0, len(params), MLFLOW_BATCH):
        client.log_batch(run_id, params=params[i : i + MLFLOW_BATCH])
    return client, run_id
