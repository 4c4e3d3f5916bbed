"""raydist.tasks: one module per kind of data. A task owns its columns, batch → tensors, model, loss,
evaluator and checkpoint extras; ``register_task`` makes it the task of manifests that name it."""

from raydist.tasks.base import (
    DataInfo,
    Encoded,
    StepContext,
    Task,
    to_tensors,
)
from raydist.tasks.labels import LabelsTask
from raydist.tasks.pairs import PairsTask
from raydist.tasks.registry import build_task, check_task_config, get_task, register_task, task_names

__all__ = [
    "DataInfo",
    "Encoded",
    "LabelsTask",
    "PairsTask",
    "StepContext",
    "Task",
    "build_task",
    "check_task_config",
    "get_task",
    "register_task",
    "task_names",
    "to_tensors",
]
