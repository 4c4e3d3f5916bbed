"""raydist.checkpoint: checkpoint folders (save, load, find, compatibility) and the state registry."""

from raydist.checkpoint.io import (
    ARCHITECTURE_KEYS,
    CONFIG_FILE,
    STATE_FILE,
    TASK_FILE,
    check_compatible,
    find_checkpoint,
    load_checkpoint,
    load_task_info,
    recorded_dataset,
    resumed_config,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from raydist.checkpoint.registry import Stateful, StateRegistry

__all__ = [
    "ARCHITECTURE_KEYS",
    "CONFIG_FILE",
    "STATE_FILE",
    "TASK_FILE",
    "StateRegistry",
    "Stateful",
    "check_compatible",
    "find_checkpoint",
    "load_checkpoint",
    "load_task_info",
    "recorded_dataset",
    "resumed_config",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]
