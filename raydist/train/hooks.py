"""Loop hooks: the only way optional machinery joins the training loop. A hook may register state for
checkpoints (``setup``), act before a step, after backward (gradient statistics), after the optimizer step
(tracking), and at the end of an epoch (evaluation)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from raydist.checkpoint import StateRegistry
from raydist.config import Config
from raydist.models import unwrap_model
from raydist.registry import Registry
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
    """The model evaluated on the val split at the end of each epoch (``val/<metric>`` entries on rank 0): every
    rank embeds its share of the split, rank 0 computes the metrics once (:meth:`Task.evaluate_on_ranks`)."""

    def __init__(self, task: Task, device: Any = "cpu") -> None:
        self.task, self.device = task, device

    def end_of_epoch(self, ctx: StepContext, model: nn.Module, metrics: dict[str, Any]) -> None:
        val = self.task.evaluate_on_ranks(unwrap_model(model), "val", self.device)
        if val is not None:
            metrics.update({f"val/{k}": v for k, v in val.items()})


@dataclass(frozen=True)
class HookSite:
    """What a hook factory may look at: the run's config and task, the loop's ``runtime`` (device, rank, world,
    in-memory ``arrays`` or None, ``plan``), the local run folder (None on remote storage) and where the driver
    writes its stop file (None: in ``run_dir``)."""

    cfg: Config
    task: Task
    runtime: Any
    run_dir: str | None
    stop_file: str | None = None


HookFactory = Callable[[HookSite], "Hook | None"]
HOOKS: Registry[HookFactory] = Registry("hook")
DEFAULT_HOOK_ORDER = 50  # between validation (30) and tracking (90): a hook's metrics are tracked


def register_hook(name: str, *, order: int = DEFAULT_HOOK_ORDER) -> Callable[[HookFactory], HookFactory]:
    """Register ``factory(site: HookSite) -> Hook | None`` under ``name`` (a decorator). Every run calls every
    registered factory on every worker; a factory returns None to stay out of a run (e.g. when its config
    does not ask for it). Hooks run in ``order`` (lower first, then by name): fault injection 0-10, gradient
    clustering 20, validation 30, the default 50, tracking 90, the stop file 100."""

    def register(factory: HookFactory) -> HookFactory:
        factory.hook_order = order  # type: ignore[attr-defined]
        return HOOKS.register(name, factory)

    return register


def hook_order(factory: HookFactory) -> int:
    """Where a registered factory's hook runs (:func:`register_hook`)."""
    return int(getattr(factory, "hook_order", DEFAULT_HOOK_ORDER))


def registered_hooks(site: HookSite) -> list[Hook]:
    """The hooks of a run: every registered factory's hook, in order, leaving out the factories that
    return None."""
    entries = sorted(HOOKS.entries(), key=lambda e: (hook_order(e.obj), e.name))
    return [hook for e in entries if (hook := e.obj(site)) is not None]
