"""The run plan: what a training run needs from its config and dataset, resolved once on the driver.

:func:`prepare_run` reads the dataset's manifest once, asks every component whether the config fits the data
(:func:`check_run`: the dataset itself, the task and its loss kind, the image settings, gradient caching, the
split size), resolves the schedule (:func:`resolve_schedule`) and builds the task and the step plan. The Ray
trainer, the in-process run, Tune trials and the finish step all take the :class:`RunPlan`; nothing after it
reads the manifest or rebuilds the task again (a Ray worker, on its own node, reads its dataset copy once).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from raydist.config import Config, ConfigError, epoch_steps, failure_retries, set_keys
from raydist.data import check_split_size, ensure_default_dataset, validate_dataset
from raydist.data.remote import data_location, local_dataset
from raydist.distributed import StepPlan
from raydist.losses import LossKind, get_loss
from raydist.tasks import DataInfo, Task, build_task, check_task_config, get_task, task_names
from raydist.tasks.images import augmentation, check_image_config
from raydist.train.gradient_caching import check_grad_cache


@dataclass(frozen=True)
class RunPlan:
    """A run, resolved: ``cfg`` is the config to run (:func:`resolve_schedule`: epochs raised for
    ``train.min_steps``, the SH warm-up for its steps, ``data.crop``/``flip`` auto decided), ``info`` the
    dataset's facts with its manifest, ``task`` built from both, ``schedule`` the schedule's one-line
    description."""

    cfg: Config
    info: DataInfo  # info.data_dir: the local dataset folder (a URI's checked copy)
    task: Task
    schedule: str
    augmentation: str | None = None  # encoded images: the train views chosen (data.crop/flip auto explained)

    def console_lines(self) -> list[str]:
        """What the console shows before training, in order: the augmentation chosen for encoded images, the
        schedule, and the task's notes on the data (e.g. truncated captions)."""
        first = [self.augmentation] if self.augmentation else []
        return [*first, self.schedule, *self.task.data_notes()]

    @property
    def data_dir(self) -> Path:
        """The local dataset folder (a URI's checked copy)."""
        return self.info.data_dir

    @property
    def location(self) -> str:
        """Where each worker finds the dataset: the configured path (absolute) or URI, which every node
        resolves itself (:func:`raydist.data.remote.local_dataset`); the embedded dataset's folder otherwise."""
        return data_location(self.cfg.data.path) if self.cfg.data.path else str(self.data_dir)

    def step_plan(self, world: int = 1) -> StepPlan:
        """The rows each of ``world`` workers embeds per step and the negative-set draws
        (:class:`raydist.distributed.StepPlan`)."""
        return step_plan(self.cfg, self.info.task, world)

    def trial(self, cfg: Config) -> RunPlan:
        """The plan of another config on the same, already checked data (a Tune trial): its schedule resolved
        and its task built; the dataset is not read or validated again."""
        return plan_for(cfg, self.info)


def loss_kind(cfg: Config, task: str) -> type[LossKind] | None:
    """The loss kind class ``cfg`` trains task ``task`` with (``auto``: the task's default); None for a task
    that computes its own loss."""
    name = get_task(task).loss_kind(cfg)
    return None if name == "auto" else get_loss(name)


def step_plan(cfg: Config, task: str, world: int | None = None) -> StepPlan:
    """The step plan of ``cfg`` on task ``task`` with ``world`` workers (default ``train.num_workers``, at least
    1): the global batch and the loss kind's negative-set size. The one place a StepPlan is made from a config."""
    kind = loss_kind(cfg, task)
    world = max(cfg.train.num_workers, 1) if world is None else world
    return StepPlan(cfg.train.batch_size, kind.negative_set_size(cfg) if kind else None, world)


def resolve_data_dir(cfg: Config) -> Path:
    """The configured dataset folder (absolute; a URI's local copy: :func:`raydist.data.remote.local_dataset`),
    or the embedded default dataset (generated once)."""
    if cfg.data.path:
        return local_dataset(cfg.data.path)
    return ensure_default_dataset()


def open_dataset(cfg: Config) -> DataInfo:
    """The facts of the run's dataset (``info.data_dir`` its local folder), its manifest read once and the
    whole folder validated (every shard, vocabulary and image; a problem raises
    :class:`raydist.data.RaydistDataError`)."""
    data_dir = resolve_data_dir(cfg)
    info = DataInfo.from_dataset(data_dir)
    validate_dataset(data_dir, tasks=task_names(), manifest=info.manifest).raise_if_problems()
    return info


def check_run(cfg: Config, info: DataInfo, configs: Iterable[Config] = ()) -> None:
    """The one place that asks every component whether ``cfg`` (and every config of ``configs``, e.g. all
    trials of a sweep) fits the dataset ``info`` describes, before Ray starts: the task and its loss kind
    (:func:`raydist.tasks.check_task_config`; those of ``configs`` with any loss kind the task trains), the image
    encoder and the memory for encoded images, gradient caching, a train split of at least one step and of at least
    the loss memory's rows (:func:`check_memory_size`) and of the mined negatives' ranks (:func:`check_mining_rows`)."""
    configs = tuple(configs)
    check_task_config(cfg, info)
    for c in configs:
        check_task_config(c, info, any_loss_kind=True)
    for c in (cfg, *configs):
        check_image_config(c, info)
        check_grad_cache(c, info)  # train.grad_cache_chunk: no BatchNorm in the image encoder
    rows = max(step_plan(c, info.task).rows_per_step for c in (cfg, *configs))
    check_split_size(info.data_dir, "train", rows, manifest=info.manifest)
    for c in (cfg, *configs):
        check_memory_size(c, info)
        check_mining_rows(c, info)


def check_memory_size(cfg: Config, info: DataInfo) -> None:
    """``loss.memory_size`` (the loss memory's rows of past batches) no larger than the train split the run
    reads: a longer queue would hold rows of this epoch twice, as their own negatives."""
    kind = loss_kind(cfg, info.task)
    size = kind.memory_size(cfg) if kind else 0
    train = int(info.manifest.splits["train"].rows * cfg.data.train_fraction)
    if size > train:
        raise ConfigError(
            f"loss.memory_size={size} is larger than the training split ({train} rows): the queue would hold "
            "rows of the same epoch twice; use at most the split's rows"
        )


def check_mining_rows(cfg: Config, info: DataInfo) -> None:
    """``loss.mined_negatives=K`` with ``loss.mine_range=[lo, hi]`` on a train split of at least K + hi rows:
    each sample's K negatives are drawn from its ranks lo..hi among the other rows."""
    kind = loss_kind(cfg, info.task)
    k = kind.mined_negatives(cfg) if kind else 0
    train = int(info.manifest.splits["train"].rows * cfg.data.train_fraction)
    if k and train < k + cfg.loss.mine_range[-1]:
        raise ConfigError(
            f"loss.mine_range={cfg.loss.mine_range} with loss.mined_negatives={k}: the training split has {train} "
            f"rows, fewer than K + hi = {k + cfg.loss.mine_range[-1]}; lower loss.mine_range or use more data"
        )


def prepare_run(cfg: Config, configs: Iterable[Config] = ()) -> RunPlan:
    """The plan of ``cfg``: its dataset opened and validated, every component's checks of ``cfg`` and of
    ``configs`` (:func:`check_run`), the schedule resolved and the task built."""
    info = open_dataset(cfg)
    check_run(cfg, info, configs)
    return plan_for(cfg, info)


def plan_for(cfg: Config, info: DataInfo) -> RunPlan:
    """The plan of ``cfg`` on a dataset already opened and checked (``info`` from :func:`open_dataset`, e.g.
    shipped to a Tune trial): the schedule resolved and the task built, nothing read again."""
    resolved, schedule = resolve_schedule(cfg, info)
    views = augmentation(cfg, info).line() if info.encoded else None  # as asked: auto choices explained
    return RunPlan(resolved, info, build_task(resolved, info), schedule, views)


def resolve_schedule(cfg: Config, info: DataInfo) -> tuple[Config, str]:
    """Epochs from steps: ``train.epochs`` is raised until the run has ``train.min_steps`` optimizer steps
    (small datasets have few steps per epoch), and the loss kind sets what it schedules by steps
    (:meth:`raydist.losses.LossKind.schedule`: the ranking loss's SH warm-up). When the epochs are raised,
    ``train.lr_decay_epoch`` and ``train.freeze_backbone_epochs`` are scaled by the same factor, so the LR
    still drops, and the backbone is still released, at the same fraction of the run. An explicit
    ``train.epochs`` that turned a preset's ``train.min_steps`` off (:func:`raydist.config.load_config`) is kept,
    and the line says what min_steps would have made of it. A null ``train.early_stop_patience`` becomes the
    task's default (``Task.early_stop_patience``); ``data.crop`` / ``data.flip`` ``auto`` are decided for encoded
    images. Returns the config to run and a one-line description of the schedule. ``info`` must come from the
    dataset (it holds the manifest)."""
    task, kind = get_task(info.task), loss_kind(cfg, info.task)
    rows = info.manifest.splits["train"].rows * cfg.data.train_fraction
    full = max(int(rows) // step_plan(cfg, info.task).rows_per_step, 1)
    t = cfg.train
    steps = epoch_steps(t, full)
    epochs = max(t.epochs, math.ceil(t.min_steps / steps))
    loss_values, loss_notes = kind.schedule(cfg, steps) if kind else ({}, [])
    patience = task.early_stop_patience(cfg)

    def scaled(n: int) -> int:  # an epoch count at the same fraction of the raised run (0 stays 0)
        return max(1, round(n * epochs / t.epochs)) if n and epochs != t.epochs else n

    decay, freeze = scaled(t.lr_decay_epoch), scaled(t.freeze_backbone_epochs)
    note = f"schedule: {epochs} epochs × {steps} steps = {epochs * steps} steps"
    if steps < full:
        note += f" (epochs cut from {full} steps by train.epoch_steps={t.epoch_steps})"
    if epochs != t.epochs:
        note += f" (train.epochs {t.epochs} raised for train.min_steps={t.min_steps}"
        if t.lr_decay_factor != 1.0 and t.lr_decay_epoch <= t.epochs:
            note += f"; LR decay at epoch {decay}, scaled from train.lr_decay_epoch={t.lr_decay_epoch}"
        if freeze != t.freeze_backbone_epochs:
            note += f"; backbone frozen {freeze} epochs, scaled from train.freeze_backbone_epochs={t.freeze_backbone_epochs}"
        note += ")"
    unapplied = cfg._unapplied_min_steps
    if unapplied and (would := math.ceil(unapplied / steps)) > t.epochs:
        note += (
            f" (train.epochs={t.epochs} as set; the preset's train.min_steps={unapplied} would have raised it to "
            f"{would} epochs)"
        )
    note += "".join(f"; {n}" for n in loss_notes)
    if t.num_workers and t.min_workers is not None and (retries := failure_retries(t)):
        note += (
            f"; elastic: up to {retries} restarts from the last checkpoint after a lost worker "
            f"(train.max_failures{'' if t.max_failures is not None else ' default for elastic runs'})"
        )
    if patience and t.early_stop_patience is None:
        note += (
            f"; early stop after {patience} epochs without a better val metric (data.label_noise="
            f"{cfg.data.label_noise}; train.early_stop_patience=0 turns it off)"
        )
    resolved = set_keys(
        cfg,
        {
            **loss_values,
            "train.epochs": epochs,
            "train.lr_decay_epoch": decay,
            "train.early_stop_patience": patience,
            "train.freeze_backbone_epochs": freeze,
        },
    )
    if info.encoded:  # data.crop/flip=auto decided once, here, so workers and checkpoints hold the choice
        resolved = set_keys(resolved, augmentation(cfg, info).overrides())
    return resolved, note
