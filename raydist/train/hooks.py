"""Loop hooks: the only way optional machinery joins the training loop. A hook may register state for
checkpoints (``setup``), act before a step, after backward (gradient statistics), after the optimizer step
(tracking), and at the end of an epoch (evaluation)."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
from torch import nn

from raydist.checkpoint import StateRegistry
from raydist.models import unwrap_model
from raydist.tasks import StepContext, Task


class Hook:
    """Base class: override the methods you need; all default to doing nothing."""

    def setup(self, model: nn.Module, registry: StateRegistry) -> None:
        """Called once before training (before a checkpoint is restored): register state here."""

    def before_step(self, ctx: StepContext) -> None:
        """Called before each optimisation step."""

    def wrap_batches(
        self, epoch: int, batches: Iterable[dict[str, np.ndarray]]
    ) -> Iterable[dict[str, np.ndarray]]:
        """The epoch's batches as this hook wants them (default: unchanged); every rank must yield the same
        number of batches."""
        return batches

    def forward_context(self, ctx: StepContext) -> AbstractContextManager[Any]:
        """A context around the step's forward pass (``ctx.batch`` holds the batch); default: none."""
        return nullcontext()

    def after_backward(self, ctx: StepContext, model: nn.Module) -> None:
        """Called after backward, before gradient clipping and the optimizer step (gradients in place)."""

    def after_step(self, ctx: StepContext, loss: float, stats: dict[str, float]) -> None:
        """Called after the optimizer step with this rank's loss value and the step's statistics."""

    def stop_requested(self, ctx: StepContext) -> bool:
        """Called after each step (and its periodic checkpoint): True makes the loop checkpoint this step and
        end the run. Every rank must return the same answer (default: never)."""
        return False

    def end_of_epoch(self, ctx: StepContext, model: nn.Module, metrics: dict[str, Any]) -> None:
        """Called after each epoch on every rank; may add entries to ``metrics``."""


class ValidationHook(Hook):
    """Rank 0 evaluates the model on the val split at the end of each epoch (``val/<metric>`` entries)."""

    def __init__(self, task: Task, device: Any = "cpu") -> None:
        self.task, self.device = task, device

    def end_of_epoch(self, ctx: StepContext, model: nn.Module, metrics: dict[str, Any]) -> None:
        if ctx.rank != 0:
            return
        metrics.update(
            {f"val/{k}": v for k, v in self.task.evaluate(unwrap_model(model), "val", self.device).items()}
        )
