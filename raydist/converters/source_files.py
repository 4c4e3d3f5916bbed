"""What the converters share: reading a source's JSON and ``.npy`` feature matrix, Karpathy's split names,
checking image files before decoding, a seeded stratified split, and writing captioned image files as an
encoded pairs dataset."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raydist.data.image_bytes import ImageFiles
from raydist.data.schema import SPLITS, RaydistDataError
from raydist.data.shards import DatasetWriter, WriteRefused
from raydist.data.vocab import Vocab

KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


def load_features(path: Path) -> np.ndarray:
    """A 2-D float feature matrix from ``.npy`` (memory-mapped, not read into memory)."""
    try:
        arr = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise RaydistDataError(f"{path}: cannot read as a .npy array: {e}") from e
    if arr.ndim != 2 or arr.dtype.kind != "f":
        raise RaydistDataError(f"{path}: expected a 2-D float array [rows, dim], got {arr.dtype} {arr.shape}")
    return arr


@dataclass(frozen=True)
class CaptionedImage:
    """One image of a pairs dataset: its id, file, captions (stripped) and where the JSON names it."""

    image_id: int
    path: Path
    captions: list[str]
    where: str


def read_json(path: Path) -> Any:
    """The JSON document of ``path``; unreadable: a RaydistDataError naming the file."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RaydistDataError(f"{path}: cannot read JSON: {e}") from e


def check_files(images: list[tuple[Path, str | None]], src: str | Path) -> None:
    """Every ``(path, where it is named or None)`` is an existing, non-empty file; else one error that lists
    every missing or empty file (up to :data:`PROBLEMS_SHOWN`, then a count), found in one pass before any
    decoding (which comes later, in the writer)."""
    bad = []
    for path, where in images:
        named = f"{where}: image file {path}" if where else str(path)
        if not path.is_file():
            bad.append(f"{named} is missing")
        elif path.stat().st_size == 0:
            bad.append(f"{named} is empty (0 bytes)")
    if bad:
        raise WriteRefused(f"missing or empty image files of {src}", bad)


def write_pairs(
    out: str | Path,
    members: Mapping[str, list[CaptionedImage]],
    *,
    min_count: int,
    source: dict[str, Any],
    rows_per_shard: int,
    overwrite: bool,
) -> Path:
    """An encoded pairs dataset: per split, one row per image (in the given order) with all its captions;
    sample_id a running row number over train, val, test; vocab from the train captions."""
    for split in SPLITS:
        if not members[split]:
            raise RaydistDataError(f"{source['src']}: split {split!r} gets no images")
    check_files([(m.path, m.where) for split in SPLITS for m in members[split]], source["src"])
    with DatasetWriter(
        out, rows_per_shard=rows_per_shard, source=source, overwrite=overwrite, all_problems=True
    ) as writer:
        writer.vocab = Vocab.build((c for m in members["train"] for c in m.captions), min_count)
        first_sample = 0
        for split in SPLITS:
            rows = members[split]
            writer.add_split(
                split,
                np.array([m.image_id for m in rows], dtype=np.int64),
                first_sample + np.arange(len(rows)),
                ImageFiles([m.path for m in rows]),
                [m.captions for m in rows],
                image_sources=[str(m.path) for m in rows],
            )
            first_sample += len(rows)
    return Path(out)


def stratified_split(labels: np.ndarray, val_fraction: float, test_fraction: float, seed: int) -> np.ndarray:
    """Per class c with n_c rows (in a seeded random order): ``round(n_c·test_fraction)`` test rows, then
    ``round(n_c·val_fraction)`` val rows, the rest train, keeping at least one train row per class."""
    rng = np.random.default_rng(seed)
    out = np.full(len(labels), "train", dtype=object)
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        n = len(members)
        n_test = min(int(np.floor(n * test_fraction + 0.5)), n - 1)
        n_val = min(int(np.floor(n * val_fraction + 0.5)), n - 1 - n_test)
        out[members[:n_test]] = "test"
        out[members[n_test : n_test + n_val]] = "val"
    return out
