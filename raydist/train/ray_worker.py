"""The Ray Train side of the loop: ``train_loop_per_worker`` builds the task and a :class:`RayRuntime`
(context, dataset shard or in-memory split, report, checkpoint) and runs :func:`raydist.train.loop.run_loop`."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs
import ray.train
import ray.train.torch
from torch import nn

from raydist.config import Config, from_saved
from raydist.data.epoch_board import EpochBoard
from raydist.data.remote import local_dataset
from raydist.data.stream import InMemoryBatches, StreamedEpochs, train_arrays, train_splits
from raydist.data.transforms import PassViews
from raydist.distributed import StepPlan
from raydist.tasks import DataInfo, Task, build_task
from raydist.train.loop import run_loop
from raydist.train.plan import step_plan
from raydist.train.wiring import build_hooks
from raydist.uris import location_of

# The score of a checkpoint without validation (mid-epoch, or a stop on request) as Ray Train gets it. The loop
# reports -inf, but Ray's checkpoint list is saved as JSON in which -inf becomes null, and a run resumed from
# that list then fails to rank its next checkpoint; a finite floor below every real metric ranks the same.
UNSCORED = -1e30


class RayRuntime:
    """Rank, device, batches, reports and restarts from Ray Train. ``epoch_boards``: the streamed splits'
    :class:`EpochBoard` keys by dataset name, when their Ray Data tasks make the per-epoch views."""

    def __init__(
        self, cfg: Config, task: Task, plan: StepPlan, source: str, epoch_boards: dict[str, str] | None = None
    ) -> None:
        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.device = ray.train.torch.get_device()
        self.cfg, self.plan, self._manifest = cfg, plan, task.info.manifest
        self._memory: InMemoryBatches | None = None
        self._stream: StreamedEpochs | None = None
        self.arrays = None  # the transformed in-memory train split (None when streaming)
        if source == "memory":
            arrays = self.arrays = train_arrays(
                task.info.data_dir,
                task.columns,
                task.transform,
                fraction=cfg.data.train_fraction,
                seed=cfg.train.seed,
                manifest=task.info.manifest,
            )
            self._memory = InMemoryBatches(
                arrays,
                rows=plan.rows_per_worker,
                rank=self.rank,
                world=self.world,
                seed=cfg.train.seed,
                epoch_transform=task.epoch_transform(),
            )
        else:
            names = train_splits(cfg.train.epochs)
            views = (
                None
                if epoch_boards is None
                else [PassViews(task.epoch_transform(), EpochBoard(epoch_boards[name])) for name in names]
            )
            self._stream = StreamedEpochs(
                [ray.train.get_dataset_shard(name) for name in names],
                rows=plan.rows_per_worker,
                shuffle_buffer=cfg.data.shuffle_buffer,
                seed=cfg.train.seed,
                rank=self.rank,
                epochs=cfg.train.epochs,
                views=views,
            )

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return ray.train.torch.prepare_model(model)

    def steps_per_epoch(self) -> int:
        if self._memory is not None:
            return self._memory.steps_per_epoch()
        rows = self._manifest.splits["train"].rows  # streaming_split(equal=True): N // W each
        return rows // self.world // self.plan.rows_per_worker

    def train_batches(self, epoch: int) -> Iterable[dict[str, np.ndarray]]:
        if self._memory is not None:
            return self._memory.epoch(epoch)
        return self._stream.epoch(epoch)

    def checkpoint_to_restore(self) -> tuple[str, str] | None:
        """The run's latest checkpoint: its own folder when the storage is a local (or mounted) path; otherwise a
        downloaded copy, named by its URI in the resume line."""
        ckpt = ray.train.get_checkpoint()
        if ckpt is None:
            return None
        if isinstance(ckpt.filesystem, pyarrow.fs.LocalFileSystem) and Path(ckpt.path).is_dir():
            return ckpt.path, ckpt.path
        return ckpt.to_directory(), location_of(ckpt.filesystem, ckpt.path)

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None) -> None:
        checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
        metrics = {k: UNSCORED if v == float("-inf") else v for k, v in metrics.items()}
        ray.train.report(metrics, checkpoint=checkpoint)


def train_loop_per_worker(loop_config: dict[str, Any]) -> dict[str, Any] | None:
    """Ray Train entry point. ``loop_config``: ``cfg`` (nested dict), ``data_dir``, ``source`` ("memory" or
    "stream"), ``epoch_boards`` (see :class:`RayRuntime`), optional ``resume_from`` (checkpoint folder) and
    ``run_dir`` (the local run folder: tracking files, fault-injection markers; None on remote storage) and
    ``stop_file`` (the driver's stop file, a path or a URI; ``data_dir`` may be a URI too: each node copies it). Rank 0 returns :func:`run_loop`'s dict plus
    ``startup``: the wall-clock times (``time.time()``) this attempt's train function started
    (``workers_started``: Ray Train's worker group is up) and its train split was ready (``data_ready``)."""
    workers_started = time.time()
    cfg = from_saved(loop_config["cfg"])
    task = build_task(cfg, DataInfo.from_dataset(local_dataset(loop_config["data_dir"])))  # this node's copy
    plan = step_plan(cfg, task.info.task, ray.train.get_context().get_world_size())
    runtime = RayRuntime(cfg, task, plan, loop_config["source"], loop_config.get("epoch_boards"))
    data_ready = time.time()
    hooks = build_hooks(cfg, task, runtime, loop_config.get("run_dir"), loop_config.get("stop_file"))
    result = run_loop(cfg, task, runtime, plan, hooks=hooks, resume_from=loop_config.get("resume_from"))
    if result is not None:
        result["startup"] = {"workers_started": workers_started, "data_ready": data_ready}
    return result
