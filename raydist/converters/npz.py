"""``raydist convert npz``: an ``.npz`` of class-labelled feature vectors (X, y, an optional split column) into a
labels dataset, optionally standardised with the train split's statistics."""

from __future__ import annotations

import argparse
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from raydist.console import warn
from raydist.converters import Converter, add_seeded_split, register_converter, seeded_split
from raydist.converters.source_files import stratified_split
from raydist.data.schema import DEFAULT_ROWS_PER_SHARD, SPLITS, RaydistDataError
from raydist.data.shards import DatasetWriter
from raydist.data.standardize import (
    SCALE_SPREAD_WARNING,
    STANDARDIZATION_NAME,
    FeatureStandardization,
    feature_scale_spread,
    fit_standardization,
)

SPLIT_NAMES = {
    "train": "train",
    "val": "val",
    "valid": "val",
    "validation": "val",
    "dev": "val",
    "test": "test",
}


SPLIT_CODES = {0: "train", 1: "val", 2: "test"}


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
        raise RaydistDataError(
            f"{path}: array 'X': expected a non-empty 2-D numeric array [rows, dim], got {x.dtype} {x.shape}"
        )
    feats = x.astype(np.float16 if x.dtype == np.float16 else np.float32)
    bad = np.flatnonzero(~np.isfinite(feats).all(axis=1))
    if len(bad):
        raise RaydistDataError(
            f"{path}: array 'X': row {int(bad[0])}: non-finite feature (NaN or inf, or "
            f"beyond float32 range); {len(bad)} such row(s)"
        )
    return feats


def _class_labels(path: Path, y: np.ndarray, rows: int) -> tuple[np.ndarray, list[str]]:
    """``y`` [N] as class indices 0…K−1 (int64) and the K distinct labels as text, in sorted order (numeric
    for integers, booleans and whole-number floats; code-point order for strings and UTF-8 bytes): class k is
    the k-th smallest distinct label."""
    if y.ndim != 1 or len(y) != rows:
        raise RaydistDataError(
            f"{path}: array 'y' has shape {y.shape} but array 'X' has {rows} rows: expected shape ({rows},)"
        )
    if y.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))
        if len(bad):
            raise RaydistDataError(
                f"{path}: array 'y': row {int(bad[0])}: label {y[bad[0]]!r} is not an "
                "integer (class labels are integers or strings)"
            )
        y = y.astype(np.int64)
    elif y.dtype.kind == "S":
        try:
            y = np.char.decode(y, "utf-8")
        except UnicodeDecodeError as e:
            raise RaydistDataError(f"{path}: array 'y': a label is not UTF-8 text: {e}") from e
    elif y.dtype.kind not in "iubU":
        raise RaydistDataError(
            f"{path}: array 'y': expected integer or string class labels, got dtype {y.dtype}"
        )
    if y.dtype.kind == "U":
        blank = np.flatnonzero(np.char.strip(y) == "")
        if len(blank):
            raise RaydistDataError(
                f"{path}: array 'y': row {int(blank[0])}: empty class label; {len(blank)} such row(s)"
            )
    values, dense = np.unique(y, return_inverse=True)
    names = [str(v) for v in values.tolist()]
    return dense.astype(np.int64).reshape(-1), names


def _standardized_features(
    path: Path, stats: FeatureStandardization, x: np.ndarray, dtype: np.dtype
) -> np.ndarray:
    """``X`` standardised with the train statistics, in the dtype the features are stored in; a constant
    train feature is named in a warning (its std is taken as 1, so it is only centred)."""
    if stats.zero_variance:
        shown = ", ".join(str(i) for i in stats.zero_variance[:10])
        more = f" (+{len(stats.zero_variance) - 10} more)" if len(stats.zero_variance) > 10 else ""
        warn(
            f"{path}: array 'X': {len(stats.zero_variance)} feature(s) constant on train (zero variance): "
            f"{shown}{more}; their std is taken as 1, so they are only centred"
        )
    feats = stats.apply(x).astype(dtype)
    bad = np.flatnonzero(~np.isfinite(feats).all(axis=1))
    if len(bad):
        raise RaydistDataError(
            f"{path}: array 'X': row {int(bad[0])}: a standardised feature does not fit "
            f"{dtype}; {len(bad)} such row(s)"
        )
    return feats


def _warn_scale_spread(path: Path, train_features: np.ndarray) -> None:
    """Warn (stderr) when the per-feature train std spans more than ``SCALE_SPREAD_WARNING``."""
    spread = feature_scale_spread(train_features)
    if spread > SCALE_SPREAD_WARNING:
        warn(
            f"{path}: array 'X': feature scales differ by a factor of {spread:.3g} (max/min per-feature std "
            "on train), so distances follow the largest features; consider --standardize"
        )


def _split_of_rows(path: Path, split: np.ndarray, rows: int) -> np.ndarray:
    """Canonical split name per row from the ``split`` array (names or codes 0/1/2)."""
    if split.ndim != 1 or len(split) != rows:
        raise RaydistDataError(
            f"{path}: array 'split' has shape {split.shape}; expected ({rows},), one per row"
        )
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
            raise RaydistDataError(
                f"{path}: array 'split': row {r}: unknown value {raw[r]!r}; accepted: {sorted(table)}"
            )
        out[r] = table[key]
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
    standardize: bool = False,
) -> Path:
    """Convert an ``.npz`` with arrays ``X`` [N, D] (numeric), ``y`` [N] (class labels: integers, strings, or
    floats holding whole numbers) and optional ``split`` [N] into a task-``labels`` dataset; return ``out``.

    ``split`` holds per row a name — ``train``; ``val`` (also ``valid``, ``validation``, ``dev``); ``test``
    (case-insensitive) — or an integer code 0 = train, 1 = val, 2 = test. Without it, a seeded stratified
    split: per class, ``round(n_c·test_fraction)`` rows test, ``round(n_c·val_fraction)`` val, the rest train
    (at least one train row per class). Labels not already exactly {0, …, K−1} are remapped to their rank
    among the sorted distinct values (K = number of distinct values; strings in code-point order); the
    manifest records the original label of each class (``class_names``, and ``source.label_map``).
    ``standardize`` maps every split's features to ``(x − mean) / std`` with the per-feature mean and std
    (ddof 0, float64) of the train rows only; a feature constant on train keeps std 1 (a warning lists such
    features); the statistics go to ``standardization.json`` for new vectors
    (:func:`raydist.data.standardize.standardize_features`). Without it, a warning on stderr recommends it
    when the per-feature train std spans more than a factor of ``SCALE_SPREAD_WARNING`` (100).
    ``image_id`` = ``sample_id`` = the row's index in ``X``; rows keep file order within a split.
    Errors name the file and the array (and row): missing X or y, shape mismatch, non-finite features,
    fractional or empty labels, unknown split values, an empty split.
    """
    path = Path(src)
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise RaydistDataError(
            f"val_fraction and test_fraction must be > 0 with a sum < 1, got {val_fraction} "
            f"and {test_fraction}"
        )
    arrays = _npz_arrays(path)
    for name in ("X", "y"):
        if name not in arrays:
            raise RaydistDataError(f"{path}: array {name!r} is missing (arrays found: {sorted(arrays)})")
    feats = _checked_features(path, arrays["X"])
    dense, class_names = _class_labels(path, arrays["y"], feats.shape[0])
    remapped = class_names != [str(k) for k in range(len(class_names))]
    label_map = {name: k for k, name in enumerate(class_names)} if remapped else None
    source: dict[str, Any] = {"converter": "npz", "src": str(path.resolve()), "label_map": label_map}
    if "split" in arrays:
        split_of = _split_of_rows(path, arrays["split"], feats.shape[0])
        source["split_rule"] = "split array"
    else:
        split_of = stratified_split(dense, val_fraction, test_fraction, seed)
        source["split_rule"] = (
            f"stratified by label: val_fraction {val_fraction}, test_fraction {test_fraction}, seed {seed}"
        )
    members = {split: np.flatnonzero(split_of == split) for split in SPLITS}
    for split, rows in members.items():
        if not len(rows):
            raise RaydistDataError(f"{path}: split {split!r} gets no rows ({source['split_rule']})")
    stats = None
    if standardize:
        stats = fit_standardization(arrays["X"][members["train"]])
        feats = _standardized_features(path, stats, arrays["X"], feats.dtype)
        source["standardization"] = f"(x - mean) / std, train mean and std ({STANDARDIZATION_NAME})"
    else:
        _warn_scale_spread(path, arrays["X"][members["train"]])
    with DatasetWriter(
        out,
        task="labels",
        num_classes=len(class_names),
        rows_per_shard=rows_per_shard,
        source=source,
        overwrite=overwrite,
    ) as writer:
        writer.class_names = class_names if remapped else None
        writer.standardization = stats
        for split, rows in members.items():
            writer.add_split(split, rows, rows, feats, labels=dense[rows], feature_index=rows)
    return Path(out)


@register_converter("npz")
class Npz(Converter):
    """An .npz with X (N×D features), y (labels) and an optional split → a labels dataset."""

    requires = ("src",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--src", help="a .npz file with X (N×D features), y (labels) and optional split")
        add_seeded_split(parser, "without a split array", "each class's rows")
        parser.add_argument(
            "--standardize",
            action="store_true",
            help="scale each feature to (x - mean) / std with the train split's mean and std (saved "
            "in the dataset as standardization.json, for new query vectors)",
        )

    def run(self, args: argparse.Namespace) -> Path:
        return convert_npz(
            args.src,
            args.out,
            overwrite=args.overwrite,
            standardize=args.standardize,
            **seeded_split(args),
        )
