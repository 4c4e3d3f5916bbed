"""Tasks by name: the shipped ones (listed here, above their modules) and any a user registers. A dataset's
manifest names its task; :func:`build_task` builds it for a config."""

from __future__ import annotations

import json
from typing import Any

from raydist.config import Config, ConfigError
from raydist.data.schema import MANIFEST_NAME, RaydistDataError
from raydist.losses import LOSSES, get_loss
from raydist.registry import Registry
from raydist.tasks.base import DataInfo, Task
from raydist.tasks.labels import LabelsTask
from raydist.tasks.pairs import PairsTask

TASKS: Registry[type[Task]] = Registry("task")
TASKS.register(PairsTask.name, PairsTask)
TASKS.register(LabelsTask.name, LabelsTask)


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: make ``cls`` the task of datasets whose manifest says ``task: cls.name``."""
    return TASKS.register(cls.name, cls)


def task_names() -> list[str]:
    """Registered task names."""
    return TASKS.names()


def get_task(name: str) -> type[Task]:
    """The task class registered as ``name``."""
    return TASKS.get(name)


def build_task(cfg: Config, info: DataInfo) -> Task:
    """The task that ``info.task`` names, for this config and data. A dataset whose manifest names no
    registered task is refused naming the manifest."""
    if info.task not in TASKS and info.data_dir is not None:
        raise RaydistDataError(
            f"{info.data_dir / MANIFEST_NAME}: field 'task': unknown task {info.task!r}; "
            f"expected one of {task_names()}"
        )
    return get_task(info.task)(cfg, info)


def _shown(value: Any) -> str:
    """A config value as it is written on the command line (``triplet``, ``false``, ``[8, 16]``)."""
    return value if isinstance(value, str) else json.dumps(value)


def _tasks_that(wants: Any, but: type[Task]) -> str:
    """``the labels task`` / ``the a and b tasks``: the other registered tasks for which ``wants`` is true."""
    names = [
        name for name, cls in ((e.name, e.obj) for e in TASKS.entries()) if cls is not but and wants(cls)
    ]
    return f"the {' and '.join(names)} task{'s' if len(names) > 1 else ''}" if names else ""


def check_task_config(cfg: Config, info: DataInfo, *, any_loss_kind: bool = False) -> None:
    """Refuse, before Ray starts, what the dataset's task would ignore: a ``loss.kind`` it does not train, and
    every key set away from its default that the task with its loss kind does not read (its loss kind's
    options, ``Task.config_keys``, :data:`raydist.tasks.base.COMMON_CONFIG_KEYS`), and loss options its kind's
    own validators refuse. A key left at its default passes. One line per problem, naming the task, its
    dataset and what it accepts. ``any_loss_kind``: a key counts as read when the task reads it with some loss
    kind (for a sweep's one-value-at-a-time configs, whose loss.kind may be swept)."""
    cls = get_task(info.task)
    where = f"the {cls.name} task ({info.data_dir})" if info.data_dir else f"the {cls.name} task"
    problems = []
    kind: str | None = cls.loss_kind(cfg)
    trains = cls.losses() or ("auto",)
    if kind in trains and kind in LOSSES:  # its options' validators, the components the kind builds
        try:
            get_loss(kind)(cfg)
        except ConfigError as e:
            problems += str(e).splitlines()
    if kind in trains and any_loss_kind:
        kind = None
    elif kind not in trains:
        owners = _tasks_that(lambda t: kind in t.losses(), cls)
        problems.append(
            f"loss.kind={kind}: {where} trains loss.kind {', '.join(dict.fromkeys(('auto', *cls.losses())))}"
            + (f"; {kind} is for {owners}" if owners else "")
        )
        kind = None  # the keys of the refused kind are not refused again
    defaults = Config().flat()
    for key, value in cfg.flat().items():
        if value == defaults[key] or cls.reads(key, kind):
            continue
        if cls.reads(key):
            kinds = cls.loss_readers(key) or ()
            problems.append(
                f"{key}={_shown(value)}: {where} reads it only with loss.kind {'/'.join(kinds)}, "
                f"not {kind} (loss.kind={cfg.loss.kind})"
            )
            continue
        owners = _tasks_that(lambda t, k=key: t.reads(k), cls)
        problems.append(
            f"{key}={_shown(value)}: {where} does not use it"
            + (f"; it is for {owners}" if owners else "")
            + f" (leave it at its default, {_shown(defaults[key])})"
        )
    if problems:
        raise ConfigError("the configuration does not fit the dataset's task:\n  " + "\n  ".join(problems))
