"""The one fact about a dataset folder that configuration needs before the data layer: which task its
manifest names (a preset's ``tasks.<task>`` block applies to it). The manifest's file name lives here too."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from raydist.uris import is_uri, join, read_bytes

MANIFEST_NAME = "manifest.json"
LABEL_MEMBER = "cls"  # a WebDataset sample's class member (KEY.cls): its presence makes the task labels


def dataset_task(dataset_dir: str | Path) -> str | None:
    """The task a dataset folder's manifest names, or None when there is no folder ("" = the default dataset)
    or no readable manifest (the dataset's full check, later, says what is wrong). A URI's manifest is read
    from the store."""
    if not is_uri(dataset_dir) and str(dataset_dir):
        task = webdataset_task(Path(dataset_dir).expanduser())
        if task is not None:
            return task
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


def webdataset_task(folder: Path) -> str | None:
    """The task of a WebDataset folder (no ``manifest.json``; ``train/*.tar`` shards): ``labels`` when the first
    train sample has a ``KEY.cls`` member, else ``pairs``; None for any other folder or an unreadable shard."""
    shards = sorted((folder / "train").glob("*.tar")) if not (folder / MANIFEST_NAME).exists() else []
    if not shards:
        return None
    key, members = None, set()
    try:
        with tarfile.open(shards[0], "r|*") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                base = member.name.rsplit("/", 1)
                name_key, _, extension = base[-1].partition(".")
                this = (base[0] if len(base) > 1 else "", name_key)
                if key is not None and this != key:
                    break
                key = this
                members.add(extension.lower())
    except (tarfile.TarError, EOFError, OSError):
        return None
    return "labels" if LABEL_MEMBER in members else "pairs"
