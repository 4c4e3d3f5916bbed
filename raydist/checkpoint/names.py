"""The file names of a checkpoint folder and the pattern of checkpoint folders in a run folder."""

STATE_FILE = "state.pt"  # written last: a folder with it is complete
CONFIG_FILE = "config.yaml"
TASK_FILE = "task.json"
CHECKPOINT_GLOB = "checkpoint_*"
