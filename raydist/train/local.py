"""A plain-process runtime for the loop: one rank, no Ray, the train split in memory, checkpoints written
to a run folder. Unit tests of the loop and of new tasks run here."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from raydist.config import Config
from raydist.data.stream import InMemoryBatches, split_columns
from raydist.distributed import StepPlan
from raydist.tasks import Task


class LocalRuntime:
    """Rank 0 of 1 in this process; reports are kept in :attr:`reports`, checkpoints in ``run_dir``."""

    rank = 0
    world = 1

    def __init__(self, cfg: Config, task: Task, plan: StepPlan, run_dir: str | Path, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        arrays = task.transform(split_columns(task.info.data_dir, "train", task.columns))
        self.batches = InMemoryBatches(arrays, rows=plan.rows_per_worker, rank=0, world=1, seed=cfg.train.seed)
        self.reports: list[dict[str, Any]] = []
        self.checkpoints: list[Path] = []

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model.to(self.device)

    def train_batches(self, epoch: int) -> Iterable[dict[str, np.ndarray]]:
        return self.batches.epoch(epoch)

    def checkpoint_to_restore(self) -> str | None:
        return None

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None) -> None:
        self.reports.append(dict(metrics))
        if checkpoint_dir:
            folder = self.run_dir / f"checkpoint_{metrics['step']:08d}"
            shutil.copytree(checkpoint_dir, folder, dirs_exist_ok=True)
            self.checkpoints.append(folder)
