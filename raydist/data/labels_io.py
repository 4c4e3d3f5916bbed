"""Labelled (task ``labels``) datasets in and out: symmetric label-noise injection into a dataset's train
split, and conversion from an ``.npz`` of features, labels and an optional split column."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from raydist.data.hashing import uniform_by_id
from raydist.data.manifest import load_manifest
from raydist.data.schema import (
    CAPTION,
    CLEAN_LABEL,
    DEFAULT_ROWS_PER_SHARD,
    IMAGE,
    IMAGE_ID,
    LABEL,
    SAMPLE_ID,
    SPLITS,
    RaydistDataError,
)
from raydist.data.shards import DatasetWriter, feature_matrix, read_split

SPLIT_NAMES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "dev": "val", "test": "test"}
SPLIT_CODES = {0: "train", 1: "val", 2: "test"}


def flip_labels(labels: np.ndarray, sample_ids: np.ndarray, *, p: float, num_classes: int, seed: int) -> np.ndarray:
    """Symmetric label noise (docs/algorithms.md#label-noise): each label y is kept with probability 1 − p
    and otherwise replaced by ``(y + s) mod K``, s uniform on {1, …, K−1} — a uniformly chosen other class.
    The draws are a function of (sample id, seed) alone, so a row gets the same noisy label in any order,
    shard or worker (streamed, in memory, or written by :func:`corrupt_labels`)."""
    if not 0.0 <= p < 1.0:
        raise RaydistDataError(f"label noise p must lie in [0, 1), got {p}")
    if p == 0:
        return labels
    if num_classes < 2:
        raise RaydistDataError(f"flipping a label needs at least 2 classes, got {num_classes}")
    flip = uniform_by_id(sample_ids, seed, 0) < p
    shift = 1 + np.minimum((uniform_by_id(sample_ids, seed, 1) * (num_classes - 1)).astype(np.int64), num_classes - 2)
    return np.where(flip, (labels + shift) % num_classes, labels)


def corrupt_labels(src: str | Path, out: str | Path, *, p: float, seed: int, overwrite: bool = False) -> Path:
    """Copy the labels dataset ``src`` to ``out`` with symmetric noise on the train labels; return ``out``.

    Each train row's label y is kept with probability 1 − p and otherwise replaced by ``(y + s) mod K``
    with s uniform on {1, …, K−1}, i.e. a uniformly chosen other class (docs/algorithms.md#label-noise).
    Val and test labels are not changed. ``clean_label`` is written on every split: the source's
    ``clean_label`` when it has one (so noise on noise keeps the original truth), else its ``label``. Ids,
    features (same dtype) and shard sizes are copied; the manifest ``source`` records p, seed, the flipped
    count and the source's own notes. Deterministic for a seed: :func:`flip_labels` draws by sample id.
    """
    src, out = Path(src), Path(out)
    if not 0.0 <= p < 1.0:
        raise RaydistDataError(f"p must lie in [0, 1), got {p}")
    if src.resolve() == out.resolve():
        raise RaydistDataError(f"{out}: the output folder must differ from the source dataset")
    manifest = load_manifest(src)
    if manifest.task != "labels":
        raise RaydistDataError(f"{src}: task is {manifest.task!r}; corrupt_labels needs a 'labels' dataset")
    classes = manifest.num_classes
    if classes < 2:
        raise RaydistDataError(f"{src}: num_classes is {classes}; flipping a label needs at least 2 classes")
    rows_per_shard = max((s.rows for info in manifest.splits.values() for s in info.shards),
                         default=DEFAULT_ROWS_PER_SHARD)
    tables = {split: read_split(src, split) for split in SPLITS}
    for split, table in tables.items():
        if CAPTION in table.column_names:
            raise RaydistDataError(f"{src}: split {split!r} has a '{CAPTION}' column, which a labels dataset "
                                   "written by raydist cannot carry")
    flipped = 0
    source: dict[str, Any] = {"transform": "corrupt_labels", "src": str(src.resolve()), "p": p, "seed": seed,
                              "noise": "symmetric: train label flipped with probability p to a uniform "
                                       "other class; val/test unchanged"}
    with DatasetWriter(out, task="labels", num_classes=classes, rows_per_shard=rows_per_shard, source=source,
                       overwrite=overwrite) as writer:
        for split, table in tables.items():
            labels = table.column(LABEL).to_numpy()
            clean = table.column(CLEAN_LABEL if CLEAN_LABEL in table.column_names else LABEL).to_numpy()
            if split == "train":
                noisy = flip_labels(labels, table.column(SAMPLE_ID).to_numpy(), p=p, num_classes=classes, seed=seed)
                flipped = int((noisy != labels).sum())
                labels = noisy
            feats = feature_matrix(table.column(IMAGE)).astype(np.dtype(manifest.feature_dtype))
            writer.add_split(split, table.column(IMAGE_ID).to_numpy(), table.column(SAMPLE_ID).to_numpy(),
                             feats, labels=labels, clean_labels=clean)
        writer.source.update({"flipped_train_rows": flipped, "parent_source": manifest.source})
    return out


def _npz_arrays(path: Path) -> dict[str, np.ndarray]:
    """All arrays of an ``.npz`` file, read eagerly (object arrays are refused: no pickle)."""
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise RaydistDataError(f"{path}: cannot read as .npz: {e}") from e
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise RaydistDataError(f"{path}: expected an .npz archive of named arrays, got a single array")
    arrays = {}
    with npz:
        for name in npz.files:
            try:
                arrays[name] = npz[name]
            except (OSError, ValueError, zipfile.BadZipFile) as e:
                raise RaydistDataError(f"{path}: array {name!r}: cannot read: {e}") from e
    return arrays


def _checked_features(path: Path, x: np.ndarray) -> np.ndarray:
    """``X`` as float32 (float16 kept) ``[N, D]``; errors name the file and the first non-finite row."""
    if x.ndim != 2 or x.dtype.kind not in "fiu" or 0 in x.shape:
        raise RaydistDataError(f"{path}: array 'X': expected a non-empty 2-D numeric array [rows, dim], "
                               f"got {x.dtype} {x.shape}")
    feats = x.astype(np.float16 if x.dtype == np.float16 else np.float32)
    bad = np.flatnonzero(~np.isfinite(feats).all(axis=1))
    if len(bad):
        raise RaydistDataError(f"{path}: array 'X': row {int(bad[0])}: non-finite feature (NaN or inf, or "
                               f"beyond float32 range); {len(bad)} such row(s)")
    return feats


def _checked_labels(path: Path, y: np.ndarray, rows: int) -> np.ndarray:
    """``y`` as int64 ``[N]``: integer dtype, or floats that are all whole numbers."""
    if y.ndim != 1 or len(y) != rows:
        raise RaydistDataError(f"{path}: array 'y' has shape {y.shape} but array 'X' has {rows} rows: expected "
                               f"shape ({rows},)")
    if y.dtype.kind in "iu":
        return y.astype(np.int64)
    if y.dtype.kind != "f":
        raise RaydistDataError(f"{path}: array 'y': expected integer class labels, got dtype {y.dtype}")
    bad = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))
    if len(bad):
        raise RaydistDataError(f"{path}: array 'y': row {int(bad[0])}: label {y[bad[0]]!r} is not an integer")
    return y.astype(np.int64)


def _split_of_rows(path: Path, split: np.ndarray, rows: int) -> np.ndarray:
    """Canonical split name per row from the ``split`` array (names or codes 0/1/2)."""
    if split.ndim != 1 or len(split) != rows:
        raise RaydistDataError(f"{path}: array 'split' has shape {split.shape}; expected ({rows},), one per row")
    raw = split.tolist()
    if split.dtype.kind in "iu":
        table, keys = SPLIT_CODES, raw
    elif split.dtype.kind in "US":
        table = SPLIT_NAMES
        keys = [(v.decode(errors="replace") if isinstance(v, bytes) else v).strip().lower() for v in raw]
    else:
        raise RaydistDataError(f"{path}: array 'split': expected strings or integer codes, got {split.dtype}")
    out = np.empty(rows, dtype=object)
    for r, key in enumerate(keys):
        if key not in table:
            raise RaydistDataError(f"{path}: array 'split': row {r}: unknown value {raw[r]!r}; accepted: "
                                   f"{sorted(table)}")
        out[r] = table[key]
    return out


def _stratified_split(labels: np.ndarray, val_fraction: float, test_fraction: float, seed: int) -> np.ndarray:
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
        out[members[n_test:n_test + n_val]] = "val"
    return out


def convert_npz(
    src: str | Path,
    out: str | Path,
    *,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
    overwrite: bool = False,
) -> Path:
    """Convert an ``.npz`` with arrays ``X`` [N, D] (numeric), ``y`` [N] (integer labels; floats holding whole
    numbers are accepted) and optional ``split`` [N] into a task-``labels`` dataset; return ``out``.

    ``split`` holds per row a name — ``train``; ``val`` (also ``valid``, ``validation``, ``dev``); ``test``
    (case-insensitive) — or an integer code 0 = train, 1 = val, 2 = test. Without it, a seeded stratified
    split: per class, ``round(n_c·test_fraction)`` rows test, ``round(n_c·val_fraction)`` val, the rest train
    (at least one train row per class). Labels not already exactly {0, …, K−1} are remapped to their rank
    among the distinct values (K = number of distinct values); the manifest ``source`` records the mapping.
    ``image_id`` = ``sample_id`` = the row's index in ``X``; rows keep file order within a split.
    Errors name the file and the array (and row): missing X or y, shape mismatch, non-finite features,
    non-integer labels, unknown split values, an empty split.
    """
    path = Path(src)
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise RaydistDataError(f"val_fraction and test_fraction must be > 0 with a sum < 1, got {val_fraction} "
                               f"and {test_fraction}")
    arrays = _npz_arrays(path)
    for name in ("X", "y"):
        if name not in arrays:
            raise RaydistDataError(f"{path}: array {name!r} is missing (arrays found: {sorted(arrays)})")
    feats = _checked_features(path, arrays["X"])
    labels = _checked_labels(path, arrays["y"], feats.shape[0])
    values, dense = np.unique(labels, return_inverse=True)
    remapped = not np.array_equal(values, np.arange(len(values)))
    source: dict[str, Any] = {"converter": "npz", "src": str(path.resolve()),
                              "label_map": {str(int(v)): k for k, v in enumerate(values)} if remapped else None}
    if "split" in arrays:
        split_of = _split_of_rows(path, arrays["split"], feats.shape[0])
        source["split_rule"] = "split array"
    else:
        split_of = _stratified_split(dense, val_fraction, test_fraction, seed)
        source["split_rule"] = (f"stratified by label: val_fraction {val_fraction}, test_fraction "
                                f"{test_fraction}, seed {seed}")
    members = {split: np.flatnonzero(split_of == split) for split in SPLITS}
    for split, rows in members.items():
        if not len(rows):
            raise RaydistDataError(f"{path}: split {split!r} gets no rows ({source['split_rule']})")
    with DatasetWriter(out, task="labels", num_classes=len(values), rows_per_shard=rows_per_shard, source=source,
                       overwrite=overwrite) as writer:
        for split, rows in members.items():
            writer.add_split(split, rows, rows, feats, labels=dense[rows], feature_index=rows)
    return Path(out)
