"""The file names of a checkpoint folder and the pattern of checkpoint folders in a run folder."""

STATE_FILE = "state.json"  # the state's non-tensor part, written last: a folder with it is complete
TENSORS_FILE = "state.safetensors"  # the state's tensors
LEGACY_STATE_FILE = "state.pt"  # an older checkpoint's pickle state: read as weights only
STATE_FILES = (STATE_FILE, LEGACY_STATE_FILE)  # either marks a complete checkpoint folder
CONFIG_FILE = "config.yaml"
TASK_FILE = "task.json"
CHECKPOINT_GLOB = "checkpoint_*"
