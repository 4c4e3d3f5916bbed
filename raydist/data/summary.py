"""What a dataset holds, in a few lines: per split its images, rows and captions (pairs) or classes (labels),
the image format, and what the converter skipped. Printed by ``raydist make-data``, ``raydist convert`` and
``raydist data summary DIR``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raydist.data.labels_io import split_class_counts
from raydist.data.manifest import load_manifest
from raydist.data.schema import CAPTIONS


def caption_count(data_dir: str | Path, split: str) -> int:
    """Captions of an encoded pairs split (its rows are images, each with a list of captions); only the
    ``captions`` column is read."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from raydist.data.shards import split_files

    return sum(
        int(pc.sum(pc.list_value_length(pq.read_table(f, columns=[CAPTIONS]).column(CAPTIONS))).as_py() or 0)
        for f in split_files(data_dir, split)
    )


def dataset_summary(data_dir: str | Path) -> list[str]:
    """``task pairs, 128-d float32 features`` then one line per split (``train  3,000 images  15,000
    captions``), then the files a converter skipped."""
    manifest = load_manifest(data_dir)
    if manifest.image_format == "encoded":
        h, w = manifest.image_size or (0, 0)
        kind = f"encoded images (median {h}×{w}, {manifest.image_channels} channel(s))"
    else:
        kind = f"{manifest.feature_dim}-d {manifest.feature_dtype} features"
    lines = [
        f"task {manifest.task}, {kind}"
        + (f", {manifest.num_classes} classes" if manifest.num_classes else "")
    ]
    classes = split_class_counts(data_dir) if manifest.task == "labels" else {}
    for split, info in manifest.splits.items():
        parts = [f"{info.images:>9,} images"]
        if manifest.task == "pairs":
            captions = caption_count(data_dir, split) if manifest.image_format == "encoded" else info.rows
            parts.append(f"{captions:>9,} captions")
        else:
            parts.append(f"{info.rows:>9,} rows  {int(np.count_nonzero(classes[split])):>5} classes")
        lines.append(f"  {split:<6}" + "  ".join(parts))
    ignored = (manifest.source or {}).get("ignored_files") or {}
    if ignored:
        counts = ", ".join(f"{suffix}: {n}" for suffix, n in sorted(ignored.items()))
        lines.append(f"  skipped {sum(ignored.values())} file(s) that are not images ({counts})")
    return lines
