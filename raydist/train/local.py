"""A plain-process runtime for the loop: one rank, no Ray, the train split in memory, checkpoints written
to a run folder (the best ``keep`` by the task's validation metric and the newest are kept). Runs with
``train.num_workers=0`` and unit tests of the loop and of new tasks use it."""

from __future__ import annotations

import pickle
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from raydist.checkpoint import newest_checkpoint
from raydist.config import Config
from raydist.console import say
from raydist.data.stream import Batch, InMemoryBatches, train_arrays
from raydist.distributed import StepPlan
from raydist.tasks import Task

ReportListener = Callable[[dict[str, Any], "Path | None"], None]


def split_key(cfg: Config, task: Task) -> tuple[Any, ...]:
    """What a run's in-memory train split depends on: the dataset, the columns read, the once-only transform
    (:meth:`Task.stream_transform`: decoded images, tokenised captions, noisy labels) and the subset
    (``data.train_fraction`` drawn with ``train.seed``)."""
    return (
        str(task.info.data_dir),
        tuple(task.columns),
        task.stream_transform(),
        cfg.data.train_fraction,
        cfg.train.seed,
    )


@dataclass(frozen=True)
class SharedSplit:
    """A train split read and transformed once (images decoded) by one process, for other in-process runs of the
    same data to take instead of reading and decoding it again (the Tune trials of ``raydist train --auto``, which
    get it through Ray's object store). A run takes it only when its :func:`split_key` is ``key``."""

    key: tuple[Any, ...]
    arrays: Batch

    @classmethod
    def read(cls, cfg: Config, task: Task) -> SharedSplit:
        return cls(
            split_key(cfg, task),
            train_arrays(
                task.info.data_dir,
                task.columns,
                task.transform,
                fraction=cfg.data.train_fraction,
                seed=cfg.train.seed,
                manifest=task.info.manifest,
            ),
        )

    def fits(self, cfg: Config, task: Task) -> bool:
        return self.key == split_key(cfg, task)

    def travels(self) -> bool:
        """Whether another process can tell that it fits: the key equals itself after pickling (a caption
        transform holds a tokenizer object, which compares by identity)."""
        return pickle.loads(pickle.dumps(self.key)) == self.key


class LocalRuntime:
    """Rank 0 of 1 in this process; reports are kept in :attr:`reports`, checkpoints in ``run_dir``; each report
    is also passed to ``on_report(metrics, checkpoint folder or None)`` when given. A ``shared`` split that fits
    the run (:meth:`SharedSplit.fits`) is its train split; otherwise the split is read here."""

    rank = 0
    world = 1

    def __init__(
        self,
        cfg: Config,
        task: Task,
        plan: StepPlan,
        run_dir: str | Path,
        device: str = "cpu",
        *,
        keep: int | None = None,
        on_report: ReportListener | None = None,
        shared: SharedSplit | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metric, self.keep = f"val/{task.primary_metric}", keep
        self.plan = plan
        if shared is not None and shared.fits(cfg, task):
            arrays = self.arrays = shared.arrays
            say(
                f"[raydist] train split: {len(next(iter(arrays.values())))} rows shared by the driver, not read again"
            )
        else:
            arrays = self.arrays = train_arrays(
                task.info.data_dir,
                task.columns,
                task.transform,
                fraction=cfg.data.train_fraction,
                seed=cfg.train.seed,
                manifest=task.info.manifest,
            )
        self.batches = InMemoryBatches(
            arrays,
            rows=plan.rows_per_worker,
            rank=0,
            world=1,
            seed=cfg.train.seed,
            epoch_transform=task.epoch_transform(),
        )
        self.reports: list[dict[str, Any]] = []
        self.checkpoints: list[Path] = []  # kept checkpoint folders, oldest first
        self.scores: dict[Path, float] = {}
        self.on_report = on_report

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def steps_per_epoch(self) -> int:
        return self.batches.steps_per_epoch()

    def train_batches(self, epoch: int) -> Iterable[dict[str, np.ndarray]]:
        return self.batches.epoch(epoch)

    def checkpoint_to_restore(self) -> tuple[str, str] | None:
        """The newest checkpoint already in the run folder (a run restarted under the same name resumes)."""
        newest = newest_checkpoint(self.run_dir)
        return (str(newest), str(newest)) if newest else None

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None) -> None:
        self.reports.append(dict(metrics))
        folder = self._keep_checkpoint(metrics, checkpoint_dir) if checkpoint_dir else None
        if self.on_report is not None:
            self.on_report(dict(metrics), folder)

    def _keep_checkpoint(self, metrics: dict[str, Any], checkpoint_dir: str) -> Path | None:
        """Move ``checkpoint_dir`` into the run folder as ``checkpoint_<step>``; the kept folder (None when
        pruned at once)."""
        folder = self.run_dir / f"checkpoint_{metrics['step']:08d}"
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(checkpoint_dir, tmp)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        self.checkpoints = [c for c in self.checkpoints if c != folder] + [folder]
        self.scores[folder] = float(metrics.get(self.metric, float("-inf")))
        self._prune()
        return folder if folder in self.checkpoints else None

    def best_checkpoint(self) -> Path | None:
        """The kept checkpoint with the highest validation metric (None when none was validated)."""
        scored = [c for c in self.checkpoints if self.scores[c] > float("-inf")]
        return max(scored, key=lambda c: self.scores[c]) if scored else None

    def _prune(self) -> None:
        """Keep the ``keep`` best by the metric and the newest; delete the others."""
        if self.keep is None:
            return
        ranked = sorted(self.checkpoints, key=lambda c: self.scores[c], reverse=True)[: self.keep]
        keep = set(ranked) | {self.checkpoints[-1]}
        for folder in [c for c in self.checkpoints if c not in keep]:
            shutil.rmtree(folder, ignore_errors=True)
        self.checkpoints = [c for c in self.checkpoints if c in keep]
