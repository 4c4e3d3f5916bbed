"""Labelled (task ``labels``) datasets in and out: symmetric label-noise injection into a dataset's train
split, and conversion from an ``.npz`` of features, labels and an optional split column."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from raydist.console import warn
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
from raydist.data.standardize import (
    SCALE_SPREAD_WARNING,
    STANDARDIZATION_NAME,
    FeatureStandardization,
    feature_scale_spread,
    fit_standardization,
    load_standardization,
)
from raydist.data.webdataset import read_shard

SPLIT_NAMES = {
    "train": "train",
    "val": "val",
    "valid": "val",
    "validation": "val",
    "dev": "val",
    "test": "test",
}
SPLIT_CODES = {0: "train", 1: "val", 2: "test"}


CLASSES_NAMED = 5  # a missing-class note names this many classes, then counts the rest


def split_class_counts(data_dir: str | Path) -> dict[str, np.ndarray]:
    """Rows per class (``bincount`` over ``num_classes``) of every split of a labels dataset; only the
    ``label`` column is read."""

    from raydist.data.shards import split_files

    manifest = load_manifest(data_dir)
    k = manifest.num_classes or 0
    counts = {}
    for split in manifest.splits:
        labels = [read_shard(f, [LABEL]).column(LABEL).to_numpy() for f in split_files(data_dir, split)]
        counts[split] = np.bincount(np.concatenate(labels).astype(np.int64), minlength=k)
    return counts


def missing_class_notes(counts: dict[str, np.ndarray], class_names: list[str] | None = None) -> list[str]:
    """Warnings for splits that lack a class another split has, where the two splits share classes (a split
    into disjoint classes -- the CUB/Cars/SOP retrieval protocol -- is by design and gets none): the missing
    classes with their row counts in the other splits, the first :data:`CLASSES_NAMED` by name."""
    present = {split: set(np.flatnonzero(c).tolist()) for split, c in counts.items()}
    notes = []
    for split, classes in present.items():
        missing = sorted(
            {
                c
                for other, theirs in present.items()
                if other != split and theirs & classes
                for c in theirs - classes
            }
        )
        if not missing:
            continue
        named = []
        for c in missing[:CLASSES_NAMED]:
            name = f"{c} ({class_names[c]})" if class_names and c < len(class_names) else str(c)
            rows = ", ".join(f"{o} {int(counts[o][c])}" for o in counts if o != split and counts[o][c])
            named.append(f"class {name}: {rows}")
        more = f"; and {len(missing) - CLASSES_NAMED} more" if len(missing) > CLASSES_NAMED else ""
        notes.append(
            f"warning: split {split!r} has no rows of {len(missing)} of the {len(set().union(*present.values()))} "
            f"classes ({'; '.join(named)}{more}): "
            + (
                "those classes are never trained on"
                if split == "train"
                else f"{split} metrics leave those classes out"
            )
        )
    return notes


def flip_labels(
    labels: np.ndarray, sample_ids: np.ndarray, *, p: float, num_classes: int, seed: int
) -> np.ndarray:
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
    shift = 1 + np.minimum(
        (uniform_by_id(sample_ids, seed, 1) * (num_classes - 1)).astype(np.int64), num_classes - 2
    )
    return np.where(flip, (labels + shift) % num_classes, labels)


def corrupt_labels(src: str | Path, out: str | Path, *, p: float, seed: int, overwrite: bool = False) -> Path:
    """Copy the labels dataset ``src`` to ``out`` with symmetric noise on the train labels; return ``out``.

    Each train row's label y is kept with probability 1 − p and otherwise replaced by ``(y + s) mod K``
    with s uniform on {1, …, K−1}, i.e. a uniformly chosen other class (docs/algorithms.md#label-noise).
    Val and test labels are not changed. ``clean_label`` is written on every split: the source's
    ``clean_label`` when it has one (so noise on noise keeps the original truth), else its ``label``. Ids,
    features (same dtype), shard sizes, class names and a standardisation file are copied; the manifest
    ``source`` records p, seed, the flipped count and the source's own notes. Deterministic for a seed:
    :func:`flip_labels` draws by sample id.
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
    rows_per_shard = max(
        (s.rows for info in manifest.splits.values() for s in info.shards), default=DEFAULT_ROWS_PER_SHARD
    )
    tables = {split: read_split(src, split) for split in SPLITS}
    for split, table in tables.items():
        if CAPTION in table.column_names:
            raise RaydistDataError(
                f"{src}: split {split!r} has a '{CAPTION}' column, which a labels dataset "
                "written by raydist cannot carry"
            )
    flipped = 0
    source: dict[str, Any] = {
        "transform": "corrupt_labels",
        "src": str(src.resolve()),
        "p": p,
        "seed": seed,
        "noise": "symmetric: train label flipped with probability p to a uniform "
        "other class; val/test unchanged",
    }
    with DatasetWriter(
        out,
        task="labels",
        num_classes=classes,
        rows_per_shard=rows_per_shard,
        source=source,
        overwrite=overwrite,
    ) as writer:
        writer.class_names, writer.standardization = manifest.class_names, load_standardization(src)
        for split, table in tables.items():
            labels = table.column(LABEL).to_numpy()
            clean = table.column(CLEAN_LABEL if CLEAN_LABEL in table.column_names else LABEL).to_numpy()
            if split == "train":
                noisy = flip_labels(
                    labels, table.column(SAMPLE_ID).to_numpy(), p=p, num_classes=classes, seed=seed
                )
                flipped = int((noisy != labels).sum())
                labels = noisy
            feats = feature_matrix(table.column(IMAGE)).astype(np.dtype(manifest.feature_dtype))
            writer.add_split(
                split,
                table.column(IMAGE_ID).to_numpy(),
                table.column(SAMPLE_ID).to_numpy(),
                feats,
                labels=labels,
                clean_labels=clean,
            )
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
        out[members[n_test : n_test + n_val]] = "val"
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
        split_of = _stratified_split(dense, val_fraction, test_fraction, seed)
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
