"""The optimizer, its parameter groups and the LR schedule of a run, and the frozen-backbone phase of fine-tuning
(``train.optimizer``, ``train.weight_decay``, ``train.backbone_lr_mult``, ``train.lr_schedule``,
``train.warmup_steps``, ``train.freeze_backbone_epochs``). The defaults build today's Adam + StepLR exactly."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from raydist.config import TrainSection
from raydist.models.image_encoders import BackboneEncoder
from raydist.models.text_encoders import PretrainedTextEncoder

# Layers whose parameters get no weight decay: normalisation layers (scales and shifts), whatever their shape.
NORM_LAYERS: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.RMSNorm,
    nn.LocalResponseNorm,
)
_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def backbone_parameter_names(model: nn.Module) -> list[str]:
    """Names (as ``model.named_parameters()`` gives them) of the trunks inside ``model``: the
    ``backbone`` of every image encoder (:class:`BackboneEncoder`: small-cnn, torchvision, timm) and of a
    HuggingFace text encoder (:class:`PretrainedTextEncoder`). Their new heads are not in it, nor is the rest."""
    owners = [m.backbone for m in model.modules() if isinstance(m, (BackboneEncoder, PretrainedTextEncoder))]
    ids = {id(p) for trunk in owners for p in trunk.parameters()}
    return [name for name, p in model.named_parameters() if id(p) in ids]


def no_decay_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters weight decay leaves alone: those of normalisation layers (:data:`NORM_LAYERS`)
    and every parameter with at most one dimension (biases, GRU biases, scalars such as the margin loss's β)."""
    norm_ids = {
        id(p) for m in model.modules() if isinstance(m, NORM_LAYERS) for p in m.parameters(recurse=False)
    }
    return [name for name, p in model.named_parameters() if p.ndim <= 1 or id(p) in norm_ids]


def parameter_groups(model: nn.Module, train: TrainSection) -> list[dict[str, Any]]:
    """The trainable parameters in up to four named groups, empty ones left out: ``decay``, ``no_decay``,
    ``backbone``, ``backbone_no_decay``. A group's LR is ``train.lr`` (× ``train.backbone_lr_mult`` for the
    backbone groups) and its weight decay ``train.weight_decay`` (0 for the ``no_decay`` groups)."""
    backbone, no_decay = set(backbone_parameter_names(model)), set(no_decay_parameter_names(model))
    groups: dict[str, dict[str, Any]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        key = ("backbone_" if name in backbone else "") + ("no_decay" if name in no_decay else "decay")
        key = "backbone" if key == "backbone_decay" else key
        if key not in groups:
            lr = train.lr * (train.backbone_lr_mult if name in backbone else 1.0)
            groups[key] = {
                "name": key,
                "params": [],
                "lr": lr,
                "weight_decay": 0.0 if name in no_decay else train.weight_decay,
            }
        groups[key]["params"].append(p)
    order = ("decay", "no_decay", "backbone", "backbone_no_decay")
    return [groups[k] for k in order if k in groups]


def build_optimizer(model: nn.Module, train: TrainSection) -> torch.optim.Optimizer:
    """``train.optimizer`` (``adam``: torch's Adam, weight decay as an L2 term added to the gradient; ``adamw``:
    decoupled decay, Loshchilov & Hutter 2019). Without weight decay and with ``backbone_lr_mult`` 1 it holds
    one group of ``model.parameters()`` at ``train.lr`` (the default: today's optimizer exactly); otherwise the
    groups of :func:`parameter_groups`."""
    cls = _OPTIMIZERS[train.optimizer]
    if train.weight_decay == 0 and train.backbone_lr_mult == 1:
        return cls(model.parameters(), lr=train.lr, weight_decay=0.0)
    return cls(parameter_groups(model, train), lr=train.lr)


class EpochStepLR(torch.optim.lr_scheduler.StepLR):
    """torch's StepLR stepped once per epoch: ``lr = train.lr · γ^⌊epoch / lr_decay_epoch⌋`` (VSE++'s
    ``lr_update``). The default schedule; its state is StepLR's, so checkpoints of either resume in the other."""

    def after_step(self) -> None:
        """Called after every optimizer step: nothing changes within an epoch."""

    def after_epoch(self) -> None:
        """Called after every epoch: one StepLR step."""
        self.step()


class WarmupDecay:
    """Every group's LR is its base LR × ``factor(s, e)`` at optimizer step s (0-based, counted over the run)
    during epoch e (0-based): a linear warm-up ``w(s) = min(1, (s + 1) / W)`` over ``W = train.warmup_steps``
    steps, times the decay ``d``:

    - ``step``: ``d = γ^⌊e / lr_decay_epoch⌋`` (StepLR's epochs, γ = ``train.lr_decay_factor``);
    - ``cosine``: ``d = ½ (1 + cos(π · min(1, max(0, s − W) / max(T − W, 1))))`` over the run's
      ``T = train.epochs × steps_per_epoch`` steps, from the base LR after warm-up to 0.
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, train: TrainSection, steps_per_epoch: int | None
    ) -> None:
        if train.lr_schedule == "cosine" and steps_per_epoch is None:
            raise ValueError("train.lr_schedule=cosine needs the run's steps per epoch")
        self.optimizer = optimizer
        self.kind, self.warmup = train.lr_schedule, train.warmup_steps
        self.decay_epoch, self.gamma = train.lr_decay_epoch, train.lr_decay_factor
        self.total_steps = train.epochs * max(steps_per_epoch or 1, 1)
        self.base_lrs = [group["lr"] for group in optimizer.param_groups]
        self.steps_done = 0  # optimizer steps of the run so far (s)
        self.epochs_done = 0  # finished epochs (e)
        self._apply()

    def factor(self) -> float:
        """The schedule's multiplier of the base LRs for the next optimizer step."""
        s, w = self.steps_done, self.warmup
        warm = min(1.0, (s + 1) / w) if w else 1.0
        if self.kind == "step":
            return warm * self.gamma ** (self.epochs_done // self.decay_epoch)
        progress = min(1.0, max(0, s - w) / max(self.total_steps - w, 1))
        return warm * 0.5 * (1.0 + math.cos(math.pi * progress))

    def _apply(self) -> None:
        f = self.factor()
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=False):
            group["lr"] = base * f

    def after_step(self) -> None:
        """Called after every optimizer step."""
        self.steps_done += 1
        self._apply()

    def after_epoch(self) -> None:
        """Called after every epoch."""
        self.epochs_done += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        """Every group's current LR."""
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps_done": self.steps_done,
            "epochs_done": self.epochs_done,
            "base_lrs": list(self.base_lrs),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "steps_done" not in state:
            raise ValueError(
                "the checkpoint's LR schedule is a StepLR (train.lr_schedule=step, "
                "train.warmup_steps=0): resume it with those values"
            )
        self.steps_done, self.epochs_done = state["steps_done"], state["epochs_done"]
        self.base_lrs = list(state["base_lrs"])
        self._apply()


def build_schedule(
    optimizer: torch.optim.Optimizer, train: TrainSection, steps_per_epoch: int | None = None
) -> EpochStepLR | WarmupDecay:
    """``train.lr_schedule`` with ``train.warmup_steps``: :class:`EpochStepLR` for ``step`` without warm-up (the
    default, today's schedule), else :class:`WarmupDecay` (stepped after every optimizer step; ``cosine`` needs
    ``steps_per_epoch``)."""
    if train.lr_schedule == "step" and train.warmup_steps == 0:
        return EpochStepLR(optimizer, step_size=train.lr_decay_epoch, gamma=train.lr_decay_factor)
    return WarmupDecay(optimizer, train, steps_per_epoch)


class BackboneFreeze:
    """``train.freeze_backbone_epochs``: during epochs ``e < epochs`` the backbone's gradients are discarded
    after backward (before hooks, clipping and the optimizer), so its weights and optimizer state stay as they
    are; from epoch ``epochs`` on it trains at its group's LR. A pure function of the epoch, so a resumed run
    unfreezes at the same epoch. Gradients are still computed: under DDP every parameter must receive one in
    every step."""

    def __init__(self, model: nn.Module, epochs: int) -> None:
        names = set(backbone_parameter_names(model))
        self.params = [p for name, p in model.named_parameters() if name in names]
        self.epochs = epochs

    def frozen(self, epoch: int) -> bool:
        """Whether the backbone is frozen during ``epoch`` (0-based)."""
        return epoch < self.epochs and bool(self.params)

    def discard_grads(self, epoch: int) -> None:
        """Drop the backbone's gradients when frozen during ``epoch``."""
        if self.frozen(epoch):
            for p in self.params:
                p.grad = None

    def line(self, epoch: int, mult: float) -> str | None:
        """What the console says at the start of ``epoch``: the freeze at the first epoch, the switch at its end."""
        if not self.params or not self.epochs:
            return None
        count = sum(p.numel() for p in self.params)
        if epoch == 0:
            return f"backbone frozen ({count:,} parameters) until epoch {self.epochs + 1}"
        if epoch == self.epochs:
            return f"backbone unfrozen ({count:,} parameters) at LR × {mult:g}"
        return None
