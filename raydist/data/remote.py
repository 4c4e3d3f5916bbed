"""Datasets on object storage (``--data s3://bucket/prefix``, ``gs://…``): the local copy a run reads.

:func:`local_dataset` reads the dataset's ``manifest.json`` from the store (checked as a local one is), then
copies the folder into the local cache (:func:`raydist.uris.cache_path`), file by file through temporary
names. A copy whose manifest is the stored one byte for byte is reused as it is (the manifest holds every
shard's sha256, so a changed dataset has a changed manifest), and a stale copy is replaced. The driver copies
before Ray starts; each Ray Train worker calls the same function, so every node makes its own copy once.

A folder (local or a URI) without ``manifest.json`` whose ``train/`` holds ``*.tar`` files is a WebDataset:
its tars are copied (from a URI) and indexed (:func:`raydist.data.webdataset.webdataset_index`)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from raydist.data.manifest import Manifest, manifest_from_dict
from raydist.data.schema import MANIFEST_NAME, SPLITS, RaydistDataError, required_columns
from raydist.data.webdataset import TAR_SUFFIX, is_webdataset, webdataset_index
from raydist.uris import (
    cache_path,
    download,
    file_sizes,
    file_type,
    filesystem,
    is_uri,
    join,
    list_folder,
    missing_location,
    read_bytes,
)


def data_location(location: str | Path) -> str:
    """A dataset location as every node can resolve it: a URI as it is, a local path made absolute."""
    return str(location) if is_uri(location) else str(Path(location).expanduser().resolve())


def local_dataset(location: str | Path) -> Path:
    """A dataset folder as a local path: a local one made absolute, a URI's up-to-date local copy (the module
    docstring). A URI without a dataset (no bucket, no ``manifest.json``, an unreachable store) raises a
    StorageError naming it, and a shard missing or at odds with the manifest (:func:`check_footers`) a
    RaydistDataError naming the shard, before anything is copied."""
    if not is_uri(location):
        folder = Path(location).expanduser().resolve()
        return webdataset_index(folder) if is_webdataset(folder) else folder
    uri = str(location).rstrip("/")
    manifest_uri = join(uri, MANIFEST_NAME)
    if file_type(manifest_uri) != "file":
        if any(name.endswith(TAR_SUFFIX) for name in list_folder(join(uri, "train"))):
            return webdataset_index(_copy_webdataset(uri))
        raise missing_location(
            uri, f"a dataset folder with {MANIFEST_NAME} (or train/, val/, test/ of *.tar)"
        )
    text = read_bytes(manifest_uri)
    try:
        manifest = manifest_from_dict(json.loads(text), where=manifest_uri)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RaydistDataError(f"{manifest_uri}: not valid JSON: {e}") from e
    dest = cache_path(uri)
    copied = dest / MANIFEST_NAME  # written last: a copy with the stored manifest is whole
    if copied.is_file() and copied.read_bytes() == text:
        return dest
    check_footers(uri, manifest)
    if dest.exists():  # another dataset was here: start over
        shutil.rmtree(dest, ignore_errors=True)
    download(uri, dest, [name for name in file_sizes(uri) if name != MANIFEST_NAME])
    tmp = dest / f"{MANIFEST_NAME}.{uuid.uuid4().hex[:8]}.part"
    tmp.write_bytes(text)
    os.replace(tmp, copied)
    return dest


def check_footers(uri: str, manifest: Manifest) -> None:
    """Before anything is copied: every Parquet shard the manifest lists is in the store, and its footer (read
    alone: a range request) has the manifest's rows and the task's columns; else a RaydistDataError naming the
    shard's URI."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fs, root = filesystem(uri)
    required = required_columns(manifest.task, manifest.image_format)
    for split in manifest.splits.values():
        for shard in split.shards:
            where = join(uri, shard.file)
            try:
                with fs.open_input_file(f"{root.rstrip('/')}/{shard.file}") as f:
                    meta = pq.ParquetFile(f).metadata
            except FileNotFoundError as e:
                raise RaydistDataError(f"{where}: shard listed in {MANIFEST_NAME} is missing") from e
            except (pa.ArrowException, OSError) as e:
                raise RaydistDataError(f"{where}: not a readable Parquet file ({e})") from e
            missing = [c for c in required if c not in meta.schema.to_arrow_schema().names]
            if missing:
                raise RaydistDataError(
                    f"{where}: required column(s) {', '.join(missing)} missing (task {manifest.task!r})"
                )
            if meta.num_rows != shard.rows:
                raise RaydistDataError(
                    f"{where}: {meta.num_rows} rows, but {MANIFEST_NAME} says {shard.rows}"
                )


def _copy_webdataset(uri: str) -> Path:
    """The local copy of a WebDataset folder's tar shards (``<split>/*.tar``; files already copied with the
    stored size are kept)."""
    dest = cache_path(uri)
    names = [n for n in file_sizes(uri) if n.endswith(TAR_SUFFIX) and n.split("/")[0] in SPLITS]
    download(uri, dest, names)
    return dest
