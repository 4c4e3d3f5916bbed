"""raydist.checkpoint: checkpoint folders (save, load, find, compatibility) and the state registry."""

from raydist.checkpoint.io import (
    CONFIG_FILE,
    STATE_FILE,
    TASK_FILE,
    check_model_fits,
    config_changes,
    find_checkpoint,
    load_checkpoint,
    load_task_info,
    newest_checkpoint,
    read_config,
    recorded_dataset,
    resumed_config,
    rng_state,
    save_checkpoint,
    set_rng_state,
    state_differences,
)
from raydist.checkpoint.registry import Stateful, StateRegistry

__all__ = [
    "CONFIG_FILE",
    "STATE_FILE",
    "TASK_FILE",
    "StateRegistry",
    "Stateful",
    "check_model_fits",
    "config_changes",
    "find_checkpoint",
    "load_checkpoint",
    "load_task_info",
    "newest_checkpoint",
    "read_config",
    "recorded_dataset",
    "resumed_config",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "state_differences",
]
