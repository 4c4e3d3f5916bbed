"""Labelled (task ``labels``) datasets: the class counts of each split (and notes on classes a split misses),
symmetric label-noise injection into a dataset's train split. Conversion from an ``.npz`` is
:mod:`raydist.converters.npz`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from raydist.data.hashing import uniform_by_id
from raydist.data.manifest import Manifest, load_manifest, manifest_or_load
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
    load_standardization,
)
from raydist.data.webdataset import read_shard

CLASSES_NAMED = 5  # a missing-class note names this many classes, then counts the rest


def split_class_counts(data_dir: str | Path, *, manifest: Manifest | None = None) -> dict[str, np.ndarray]:
    """Rows per class (``bincount`` over ``num_classes``) of every split of a labels dataset; only the
    ``label`` column is read. ``manifest``: the folder's, when read already."""

    from raydist.data.shards import split_files

    manifest = manifest_or_load(data_dir, manifest)
    k = manifest.num_classes or 0
    counts = {}
    for split in manifest.splits:
        labels = [
            read_shard(f, [LABEL]).column(LABEL).to_numpy()
            for f in split_files(data_dir, split, manifest=manifest)
        ]
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
