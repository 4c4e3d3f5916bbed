"""Tasks by name: the shipped ones (listed here, above their modules) and any a user registers. A dataset's
manifest names its task; :func:`build_task` builds it for a config."""

from __future__ import annotations

from raydist.config import Config
from raydist.data.schema import MANIFEST_NAME, RaydistDataError
from raydist.tasks.base import DataInfo, Task
from raydist.tasks.labels import LabelsTask
from raydist.tasks.pairs import PairsTask

_TASKS: dict[str, type[Task]] = {PairsTask.name: PairsTask, LabelsTask.name: LabelsTask}


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: make ``cls`` the task of datasets whose manifest says ``task: cls.name``."""
    if cls.name in _TASKS and _TASKS[cls.name] is not cls:
        raise ValueError(f"task {cls.name!r} is already registered by {_TASKS[cls.name].__module__}")
    _TASKS[cls.name] = cls
    return cls


def task_names() -> list[str]:
    """Registered task names."""
    return sorted(_TASKS)


def get_task(name: str) -> type[Task]:
    """The task class registered as ``name``."""
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; registered tasks: {', '.join(task_names())}")
    return _TASKS[name]


def build_task(cfg: Config, info: DataInfo) -> Task:
    """The task that ``info.task`` names, for this config and data. A dataset whose manifest names no
    registered task is refused naming the manifest."""
    if info.task not in _TASKS and info.data_dir is not None:
        raise RaydistDataError(f"{info.data_dir / MANIFEST_NAME}: field 'task': unknown task {info.task!r}; "
                               f"expected one of {task_names()}")
    return get_task(info.task)(cfg, info)
