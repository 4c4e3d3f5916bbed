"""Checkpoint and run folders on object storage (``s3://``, ``gs://``): the local copy every reader works on.

A checkpoint folder is copied whole, ``state.json`` (an older folder's ``state.pt``) last, so a copy with it is
complete, as a local folder is; a run folder gets its complete checkpoint folders and its run files, and the copies of checkpoints
the store no longer holds (Ray Train keeps ``train.keep_checkpoints``) are removed. Files already copied with
the stored size are not read again. The copies live under :func:`raydist.uris.cache_path`."""

from __future__ import annotations

import fnmatch
import shutil
from pathlib import Path

from raydist.checkpoint.names import CHECKPOINT_GLOB, STATE_FILES
from raydist.runfiles import BEST_CHECKPOINT_FILE, HISTORY_FILE
from raydist.uris import cache_path, download, file_sizes, file_type, join, list_folder, missing_location

RUN_FILES = (BEST_CHECKPOINT_FILE, HISTORY_FILE)  # the run-folder files a reader of a remote run needs


def remote_checkpoints(run: str) -> list[str]:
    """Names of the complete checkpoint folders (those with ``state.json`` or ``state.pt``) of a remote run folder,
    oldest first
    (by name, as :func:`raydist.checkpoint.run_checkpoints` orders local ones)."""
    entries = list_folder(run)
    names = sorted(
        n for n, kind in entries.items() if kind == "folder" and fnmatch.fnmatch(n, CHECKPOINT_GLOB)
    )
    return [n for n in names if any(file_type(join(run, n, f)) == "file" for f in STATE_FILES)]


def _fetch_checkpoint(location: str, dest: Path) -> None:
    names = sorted(file_sizes(location), key=lambda n: n in STATE_FILES)  # the mark of completeness last
    download(location, dest, names)


def fetch_run_or_checkpoint(location: str) -> Path:
    """The up-to-date local copy of a remote checkpoint folder or run folder (the module docstring); a
    location that is not there raises a StorageError naming it (and its bucket, when that is what is missing)."""
    entries = list_folder(location)
    if not entries:
        raise missing_location(location, "a checkpoint folder or a run folder with checkpoints")
    dest = cache_path(location)
    if any(entries.get(f) == "file" for f in STATE_FILES):
        _fetch_checkpoint(location, dest)
        return dest
    names = remote_checkpoints(location)
    if dest.is_dir():
        for old in dest.glob(CHECKPOINT_GLOB):
            if old.name not in names:
                shutil.rmtree(old, ignore_errors=True)
        for name in RUN_FILES:
            if name not in entries:
                (dest / name).unlink(missing_ok=True)
    for name in names:
        _fetch_checkpoint(join(location, name), dest / name)
    download(location, dest, [n for n in RUN_FILES if entries.get(n) == "file"])
    dest.mkdir(parents=True, exist_ok=True)
    return dest
