"""WebDataset shards read directly: a folder with ``train/``, ``val/`` and ``test/`` sub-folders of ``*.tar``
shards in img2dataset's layout (per sample ``KEY.jpg|jpeg|png|webp``, ``KEY.txt`` its caption, ``KEY.cls`` its
class for the labels task, ``KEY.json`` metadata, ignored). No conversion: the images stay in the tars.

:func:`webdataset_index` reads every shard once (the members' headers and the small text members; a sample
of the train images is decoded for the image size) and writes, in the local cache, a dataset folder whose
``manifest.json`` lists the tars themselves (linked, not copied) with their rows and sha256, and the vocabulary
learnt from the train captions. Every reader of shards then reads a tar through :func:`read_shard` as the same
table a Parquet shard of encoded images gives (``image_id``, ``sample_id``, ``image`` bytes, ``captions`` or
``label``), and the train stream reads them with Ray Data's ``read_webdataset`` (:func:`webdataset_stream`), so
decoding and augmentation are the Parquet path's. A sample's id is a hash of its split and key.

A shard that is not a tar, a key without an image, a caption missing or empty, a class that is not a
non-negative integer, an image that does not decode, a key twice: refused, naming the shard and the key."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import tarfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raydist.data.image_bytes import ImageInfo, check_image, dataset_channels, median_size
from raydist.data.manifest import Manifest, ShardInfo, SplitInfo, sha256_file, write_manifest
from raydist.data.schema import (
    CAPTIONS,
    IMAGE,
    IMAGE_ID,
    LABEL,
    MANIFEST_NAME,
    SAMPLE_ID,
    SPLITS,
    VOCAB_NAME,
    RaydistDataError,
)
from raydist.data.vocab import Vocab
from raydist.dataset_task import LABEL_MEMBER, dataset_task, webdataset_task
from raydist.uris import cache_root, is_uri

TAR_SUFFIX = ".tar"
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")  # the first present is the sample's image
CAPTION_EXTENSION, LABEL_EXTENSION = "txt", LABEL_MEMBER
SIZE_SAMPLE = 256  # train images decoded for the manifest's image size and channels
PROBLEMS_SHOWN = 10
_MEMBER = re.compile(
    r"^((?:.*/|)[^./]+)\.([^/]*)$"
)  # KEY.ext: the key is all before the base name's first dot


def is_tar_shard(path: str | Path) -> bool:
    """Whether a shard file is a WebDataset tar (else a Parquet file)."""
    return str(path).endswith(TAR_SUFFIX)


def is_webdataset(folder: str | Path) -> bool:
    """A local folder without ``manifest.json`` whose ``train/`` holds ``*.tar`` files."""
    folder = Path(folder)
    return not (folder / MANIFEST_NAME).exists() and any((folder / "train").glob(f"*{TAR_SUFFIX}"))


def sample_id(split: str, key: str) -> int:
    """A sample's id: 63 bits of the blake2b hash of ``split/key`` (equal keys in two splits differ)."""
    digest = hashlib.blake2b(f"{split}/{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def tar_samples(path: str | Path) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {extension: bytes})`` per sample, in tar order; consecutive members with one key are one sample.
    A file that is not a tar, or a member that is a link or whose name is absolute or has a ``..`` part
    (:func:`unsafe_member`), raises RaydistDataError naming the shard and the member's key."""
    key, files = None, {}
    try:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                unsafe = unsafe_member(member)
                if unsafe:
                    found = _MEMBER.match(member.name)
                    raise RaydistDataError(
                        f"{path}: key {found.group(1) if found else member.name}: member {member.name!r} "
                        f"refused: {unsafe}"
                    )
                match = _MEMBER.match(member.name) if member.isfile() else None
                if match is None:
                    continue
                if match.group(1) != key and key is not None:
                    yield key, files
                    files = {}
                key = match.group(1)
                files[match.group(2).lower()] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise RaydistDataError(f"{path}: not a readable tar shard ({e})") from e
    if key is not None:
        yield key, files


def unsafe_member(member: tarfile.TarInfo) -> str | None:
    """Why a tar member is refused (a shard holds files and folders named inside it), None when it is not: a
    symbolic or hard link, a device or pipe, an absolute name or one with a ``..`` part."""
    if member.issym() or member.islnk():
        return f"a link (to {member.linkname!r})"
    if not (member.isfile() or member.isdir()):
        return "not a file or a folder"
    if PurePosixPath(member.name).is_absolute():
        return "an absolute path"
    if ".." in PurePosixPath(member.name).parts:
        return "a path with '..'"
    return None


def _label(raw: bytes) -> int | None:
    try:
        value = int(raw.decode().strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return value if value >= 0 else None


def tar_table(path: str | Path, task: str, split: str) -> tuple[pa.Table, list[str], list[str]]:
    """A tar shard as the table of encoded images (one row per sample: ``image_id`` = ``sample_id`` =
    :func:`sample_id`, ``image`` bytes, ``captions`` = [caption] for task pairs, ``label`` otherwise), the
    samples' keys, and one line per sample left out (``key K: why``)."""
    keys, images, targets, problems = [], [], [], []
    for key, files in tar_samples(path):
        image = next((files[e] for e in IMAGE_EXTENSIONS if e in files), None)
        if image is None:
            found = ", ".join(f".{e}" for e in sorted(files)) or "nothing"
            problems.append(f"key {key}: no image (expected {key}.jpg, .png or .webp; found {found})")
            continue
        if task == "pairs":
            caption = files.get(CAPTION_EXTENSION, b"").decode("utf-8", errors="replace").strip()
            if not caption:
                problems.append(f"key {key}: no caption ({key}.{CAPTION_EXTENSION} missing or empty)")
                continue
            targets.append([caption])
        else:
            label = _label(files[LABEL_EXTENSION]) if LABEL_EXTENSION in files else None
            if label is None:
                problems.append(
                    f"key {key}: no class ({key}.{LABEL_EXTENSION} missing or not an integer >= 0)"
                )
                continue
            targets.append(label)
        keys.append(key)
        images.append(image)
    ids = pa.array([sample_id(split, k) for k in keys], pa.int64())
    columns = {IMAGE_ID: ids, SAMPLE_ID: ids, IMAGE: pa.array(images, pa.binary())}
    if task == "pairs":
        columns[CAPTIONS] = pa.array(targets, pa.list_(pa.string()))
    else:
        columns[LABEL] = pa.array(targets, pa.int64())
    return pa.table(columns), keys, problems


@functools.lru_cache(maxsize=64)
def _folder_task(dataset_dir: str) -> str:
    return dataset_task(dataset_dir) or "pairs"


def read_shard(path: str | Path, columns: Sequence[str] | None = None) -> pa.Table:
    """A shard's table: a Parquet file as it is, a tar of an indexed WebDataset (``<dataset>/<split>/x.tar``) as
    :func:`tar_table` gives it for the dataset's task (a sample left out raises, naming shard and key)."""
    if not is_tar_shard(path):
        return pq.read_table(path, columns=list(columns) if columns is not None else None)
    path = Path(path)
    table, _, problems = tar_table(path, _folder_task(str(path.parent.parent)), path.parent.name)
    if problems:
        raise RaydistDataError(f"{path}: {problems[0]}")
    return table.select(list(columns)) if columns is not None else table


def shard_columns(path: str | Path) -> list[str]:
    """The column names of a shard (a Parquet file's schema; a tar's per its dataset's task)."""
    if not is_tar_shard(path):
        return pq.read_schema(path).names
    task = _folder_task(str(Path(path).parent.parent))
    return [IMAGE_ID, SAMPLE_ID, IMAGE, CAPTIONS if task == "pairs" else LABEL]


def decode_sample_problems(path: str | Path, rows: np.ndarray | None) -> list[str]:
    """Decode the images of ``rows`` of a tar shard (every row when None): ``key K: why`` per image that is
    not a complete PNG, JPEG or WebP."""
    path = Path(path)
    table, keys, _ = tar_table(path, _folder_task(str(path.parent.parent)), path.parent.name)
    images = table.column(IMAGE)
    out = []
    for r in range(len(keys)) if rows is None else rows[rows < len(keys)]:
        try:
            check_image(images[int(r)].as_py())
        except RaydistDataError as e:
            out.append(f"key {keys[int(r)]}: {e}")
    return out


def _split_shards(folder: Path) -> dict[str, list[Path]]:
    shards = {split: sorted((folder / split).glob(f"*{TAR_SUFFIX}")) for split in SPLITS}
    empty = [split for split, files in shards.items() if not files]
    if empty:
        raise RaydistDataError(
            f"{folder}: no *{TAR_SUFFIX} shards in {', '.join(f'{s}/' for s in empty)}; a WebDataset folder has "
            f"one sub-folder of tar shards per split ({', '.join(f'{s}/' for s in SPLITS)})"
        )
    return shards


def _index_key(folder: Path, shards: dict[str, list[Path]]) -> str:
    stats = [
        (str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
        for s in SPLITS
        for p in shards[s]
    ]
    return hashlib.sha256(json.dumps([str(folder), stats]).encode()).hexdigest()[:20]


def webdataset_index(folder: str | Path, *, min_count: int = 1) -> Path:
    """The indexed dataset folder of a local WebDataset folder (the module docstring), built once per set of
    shards (their names, sizes and times) under the cache; every problem found raises one RaydistDataError
    naming shard and key (the first :data:`PROBLEMS_SHOWN`, then a count)."""
    folder = Path(folder).expanduser().resolve()
    shards = _split_shards(folder)
    dest = cache_root() / "webdataset" / _index_key(folder, shards)
    if (dest / MANIFEST_NAME).is_file():
        return dest
    task = webdataset_task(folder) or "pairs"
    problems: list[str] = []
    splits, captions, labels, infos = {}, [], [], []
    seen: dict[int, str] = {}
    for split in SPLITS:
        infos_split: list[ShardInfo] = []
        for path in shards[split]:
            table, keys, left_out = tar_table(path, task, split)
            where = str(path.relative_to(folder))
            problems += [f"{where}: {p}" for p in left_out]
            for key, sid in zip(keys, table.column(SAMPLE_ID).to_pylist(), strict=False):
                if sid in seen:
                    problems.append(f"{where}: key {key}: the key is in {split}/ twice (also {seen[sid]})")
                seen[sid] = where
            if split == "train" and task == "pairs":
                captions += [c[0] for c in table.column(CAPTIONS).to_pylist()]
            if task != "pairs":
                labels += table.column(LABEL).to_pylist()
            if split == "train" and len(infos) < SIZE_SAMPLE:
                images = table.column(IMAGE)
                for r in range(min(len(keys), SIZE_SAMPLE - len(infos))):
                    try:
                        infos.append(check_image(images[r].as_py()))
                    except RaydistDataError as e:
                        problems.append(f"{where}: key {keys[r]}: {e}")
            infos_split.append(ShardInfo(f"{split}/{path.name}", table.num_rows, sha256_file(path)))
        rows = sum(s.rows for s in infos_split)
        if rows == 0:
            problems.append(f"{split}/: no usable samples in its {len(infos_split)} shards")
        splits[split] = SplitInfo(rows, rows, infos_split)
    if problems:
        more = len(problems) - PROBLEMS_SHOWN
        shown = problems[:PROBLEMS_SHOWN] + ([f"... and {more} more"] if more > 0 else [])
        raise RaydistDataError(f"{folder}: WebDataset shards refused:\n  " + "\n  ".join(shown))
    return _write_index(folder, dest, shards, task, splits, captions, labels, infos, min_count)


def _write_index(
    folder: Path,
    dest: Path,
    shards: dict[str, list[Path]],
    task: str,
    splits: dict[str, SplitInfo],
    captions: list[str],
    labels: list[int],
    infos: list[ImageInfo],
    min_count: int,
) -> Path:
    """Write the index into a temporary folder (links to the tars, vocab, manifest) and move it into place."""
    tmp = dest.with_name(f"{dest.name}.{uuid.uuid4().hex[:8]}.part")
    for split in SPLITS:
        (tmp / split).mkdir(parents=True)
        for path in shards[split]:
            os.symlink(path, tmp / split / path.name)
    fields: dict[str, Any] = {}
    if task == "pairs":
        Vocab.build(captions, min_count).save(tmp / VOCAB_NAME)
        fields["vocab"] = VOCAB_NAME
    else:
        fields["num_classes"] = int(max(labels)) + 1
    manifest = Manifest(
        task=task,
        splits=splits,
        image_format="encoded",
        image_channels=dataset_channels(infos),
        image_size=median_size(infos),
        source={"webdataset": str(folder), "image_size_from": f"{len(infos)} train images"},
        **fields,
    )
    write_manifest(tmp, manifest)
    try:
        os.replace(tmp, dest)
    except OSError:  # another process indexed the same shards first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _as_columns(task: str, split: str):
    def convert(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        keys = [str(k) for k in batch["__key__"]]
        images = np.empty(len(keys), dtype=object)
        for i in range(len(keys)):  # a sample without a member of a column holds None or NaN there
            images[i] = next(
                bytes(batch[e][i])
                for e in IMAGE_EXTENSIONS
                if e in batch and isinstance(batch[e][i], (bytes, bytearray, np.ndarray))
            )
        ids = np.array([sample_id(split, k) for k in keys], dtype=np.int64)
        out = {IMAGE_ID: ids, SAMPLE_ID: ids, IMAGE: images}
        if task == "pairs":
            out[CAPTIONS] = np.empty(len(keys), dtype=object)
            for i, raw in enumerate(batch[CAPTION_EXTENSION]):
                out[CAPTIONS][i] = [bytes(raw).decode("utf-8", errors="replace").strip()]
        else:
            out[LABEL] = np.array([_label(bytes(raw)) for raw in batch[LABEL_EXTENSION]], dtype=np.int64)
        return out

    return convert


def _raw(sample: dict[str, Any]) -> dict[str, Any]:
    """Ray Data's WebDataset decoder that decodes nothing: every member stays bytes (decoding is the task's)."""
    return sample


def webdataset_stream(files: Sequence[str], task: str, split: str, *, blocks: int) -> Any:
    """A Ray Data dataset of tar shards with the columns of :func:`tar_table` (``read_webdataset``, members
    kept as bytes, then one batch function), in ``blocks`` read tasks."""
    import ray.data

    wanted = [*IMAGE_EXTENSIONS, CAPTION_EXTENSION if task == "pairs" else LABEL_EXTENSION]
    ds = ray.data.read_webdataset(
        [f if is_uri(f) else os.path.realpath(f) for f in files],  # the tars, not one node's index links
        decoder=_raw,
        suffixes=wanted,
        file_extensions=["tar"],
        override_num_blocks=blocks,
    )
    return ds.map_batches(_as_columns(task, split), batch_format="numpy")
