"""``raydist convert vsepp-precomp``: VSE++'s precomputed layout ({split}_ims.npy + {split}_caps.txt) into a
feature pairs dataset; the vocab from the train split only, no data dropped silently."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from raydist.converters import Converter, add_min_count, add_splits, register_converter, split_pairs
from raydist.converters.source_files import load_features
from raydist.data.schema import DEFAULT_ROWS_PER_SHARD, SPLITS, RaydistDataError
from raydist.data.shards import DatasetWriter
from raydist.data.vocab import Vocab

VSEPP_SPLITS = {"train": "train", "val": "dev", "test": "test"}  # raydist split -> VSE++ file prefix


def _read_captions(path: Path) -> list[str]:
    """One caption per line; an empty line is an error naming its line number."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise RaydistDataError(f"{path}: cannot read captions: {e}") from e
    for i, line in enumerate(lines):
        if not line.strip():
            raise RaydistDataError(f"{path}: line {i + 1}: empty caption")
    return [line.strip() for line in lines]


def _image_of_caption(
    ims: np.ndarray, n_caps: int, cpi: int, ims_path: Path, caps_path: Path
) -> tuple[np.ndarray, int]:
    """Row of ``ims`` holding each caption's image, and the split's captions per image, for the VSE++
    layouts (see convert_vsepp_precomp)."""
    n_ims = ims.shape[0]
    if n_ims * cpi == n_caps:
        return np.arange(n_caps) // cpi, cpi
    if n_ims == n_caps:
        if n_caps % cpi == 0 and _rows_repeat(ims, cpi, ims_path, caps_path):
            return np.arange(n_caps) - np.arange(n_caps) % cpi, cpi
        return np.arange(n_caps), 1
    if n_caps % cpi == 0:
        expected = (
            f"{n_caps // cpi} rows (one per image, captions_per_image={cpi}) or {n_caps} (one per caption)"
        )
    else:  # only one row per caption line can fit
        expected = f"{n_caps} rows (one per caption; not a multiple of captions_per_image={cpi})"
    fits = f"; captions_per_image={n_caps // n_ims} would fit" if n_ims and n_caps % n_ims == 0 else ""
    raise RaydistDataError(
        f"{ims_path} has {n_ims} rows but {caps_path} has {n_caps} captions: expected {expected}{fits}"
    )


def _rows_repeat(ims: np.ndarray, cpi: int, ims_path: Path, caps_path: Path) -> bool:
    """With one row per caption line: True when every group of ``cpi`` rows repeats one image's features
    (VSE++'s per-caption layout), False when no group does (one caption per image); some groups repeating
    and others not is an error."""
    repeating = differing = None  # first repeating group, first row that differs from its group's first
    for start in range(0, ims.shape[0], cpi * 1024):  # blocks of 1024 groups, bounded memory
        block = np.asarray(ims[start : start + cpi * 1024])
        block = block.reshape(-1, cpi, block.shape[1])
        same = (block == block[:, :1]).all(axis=2)  # [groups, cpi]: row equals its group's first row
        group_same = same.all(axis=1)
        if repeating is None and group_same.any():
            repeating = start // cpi + int(np.argmax(group_same))
        if differing is None and not group_same.all():
            differing = start + int(np.argmin(same.reshape(-1)))
        if repeating is not None and differing is not None:
            first = repeating * cpi
            raise RaydistDataError(
                f"{ims_path}: has one row per line of {caps_path.name} ({ims.shape[0]} rows) and rows "
                f"{first}..{first + cpi - 1} repeat one image's features (one row per caption, "
                f"captions_per_image={cpi}), but row {differing} differs from row "
                f"{differing - differing % cpi} (wrong captions_per_image?)"
            )
    return repeating is not None


def convert_vsepp_precomp(
    src: str | Path,
    out: str | Path,
    *,
    captions_per_image: int = 5,
    min_count: int = 4,
    splits: Mapping[str, str] | None = None,
    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
    overwrite: bool = False,
) -> Path:
    """Convert a VSE++ ``*_precomp`` folder (``{prefix}_ims.npy`` + ``{prefix}_caps.txt`` per split).

    ``splits`` maps raydist split → file prefix (default ``train``/``dev``/``test``; e.g. ``testall``
    for the 5K COCO test). Caption k belongs to image k // captions_per_image. The image array has
    either one row per image or one row per caption (identical rows repeated captions_per_image
    times, as in some VSE++ files). As many rows as captions whose rows do not repeat in groups of
    captions_per_image mean one caption per image (that split gets captions_per_image 1; the manifest's
    ``source`` records each split's value). Any other row count is an error naming both files. Image ids
    are made unique over the dataset: train images come first, then val, then test.
    Returns ``out``.
    """
    src, prefixes = Path(src), dict(splits or VSEPP_SPLITS)
    if sorted(prefixes) != sorted(SPLITS):
        raise RaydistDataError(f"splits must map each of {list(SPLITS)} to a file prefix, got {prefixes}")
    if captions_per_image < 1:
        raise RaydistDataError(f"captions_per_image must be >= 1, got {captions_per_image}")
    loaded = {}
    for split in SPLITS:
        ims_path, caps_path = src / f"{prefixes[split]}_ims.npy", src / f"{prefixes[split]}_caps.txt"
        for path in (ims_path, caps_path):
            if not path.is_file():
                raise RaydistDataError(f"{path}: missing (needed for split {split!r})")
        ims, caps = load_features(ims_path), _read_captions(caps_path)
        rows, cpi = _image_of_caption(ims, len(caps), captions_per_image, ims_path, caps_path)
        loaded[split] = (ims, caps, rows, cpi)
    source: dict[str, Any] = {
        "converter": "vsepp_precomp",
        "src": str(src.resolve()),
        "captions_per_image": captions_per_image,
        "min_count": min_count,
        "files": {s: prefixes[s] for s in SPLITS},
        "captions_per_image_by_split": {s: loaded[s][3] for s in SPLITS},
    }
    with DatasetWriter(out, rows_per_shard=rows_per_shard, source=source, overwrite=overwrite) as writer:
        writer.vocab = Vocab.build(loaded["train"][1], min_count)
        first_image = first_sample = 0
        for split in SPLITS:
            ims, caps, rows, cpi = loaded[split]
            local_image = np.arange(len(caps)) // cpi
            writer.add_split(
                split,
                first_image + local_image,
                first_sample + np.arange(len(caps)),
                ims,
                caps,
                feature_index=rows,
            )
            first_image += len(caps) // cpi
            first_sample += len(caps)
    return Path(out)


@register_converter("vsepp-precomp")
class VseppPrecomp(Converter):
    """VSE++ precomputed features: {split}_ims.npy and {split}_caps.txt → a feature pairs dataset."""

    requires = ("src",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--src", help="folder with {split}_ims.npy and {split}_caps.txt")
        parser.add_argument("--captions-per-image", type=int, default=5)
        add_min_count(parser)
        add_splits(parser, "e.g. train=train,val=dev,test=testall (the files' prefixes)")

    def run(self, args: argparse.Namespace) -> Path:
        pairs = split_pairs(args.splits)
        return convert_vsepp_precomp(
            args.src,
            args.out,
            captions_per_image=args.captions_per_image,
            min_count=args.min_count,
            splits=dict(pairs) if pairs else None,
            overwrite=args.overwrite,
        )
