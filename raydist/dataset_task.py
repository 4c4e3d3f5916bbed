"""The one fact about a dataset folder that configuration needs before the data layer: which task its
manifest names (a preset's ``tasks.<task>`` block applies to it). The manifest's file name lives here too."""

from __future__ import annotations

import json
from pathlib import Path

from raydist.uris import is_uri, join, read_bytes

MANIFEST_NAME = "manifest.json"


def dataset_task(dataset_dir: str | Path) -> str | None:
    """The task a dataset folder's manifest names, or None when there is no folder ("" = the default dataset)
    or no readable manifest (the dataset's full check, later, says what is wrong). A URI's manifest is read
    from the store."""
    try:
        if is_uri(dataset_dir):
            raw = json.loads(read_bytes(join(dataset_dir, MANIFEST_NAME)))
        else:
            path = Path(dataset_dir).expanduser() / MANIFEST_NAME if str(dataset_dir) else None
            raw = json.loads(path.read_text()) if path and path.is_file() else None
    except (
        OSError,
        ValueError,
        UnicodeDecodeError,
    ):  # unreadable, missing or unreachable (StorageError), not JSON
        return None
    task = raw.get("task") if isinstance(raw, dict) else None
    return task if isinstance(task, str) else None
