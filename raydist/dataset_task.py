"""The one fact about a dataset folder that configuration needs before the data layer: which task its
manifest names (a preset's ``tasks.<task>`` block applies to it). The manifest's file name lives here too."""

from __future__ import annotations

import json
from pathlib import Path

MANIFEST_NAME = "manifest.json"


def dataset_task(dataset_dir: str | Path) -> str | None:
    """The task a dataset folder's manifest names, or None when there is no folder ("" = the default dataset)
    or no readable manifest (the dataset's full check, later, says what is wrong)."""
    path = Path(dataset_dir).expanduser() / MANIFEST_NAME if str(dataset_dir) else None
    try:
        raw = json.loads(path.read_text()) if path and path.is_file() else None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    task = raw.get("task") if isinstance(raw, dict) else None
    return task if isinstance(task, str) else None
