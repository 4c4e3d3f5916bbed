"""Converters into the raydist shard format: the VSE++ precomputed layout and COCO-style captions JSON
with a feature matrix. Both build the vocab from the train split only and never drop data silently."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from raydist.data.schema import DEFAULT_ROWS_PER_SHARD, SPLITS, RaydistDataError
from raydist.data.shards import DatasetWriter
from raydist.data.vocab import Vocab

VSEPP_SPLITS = {"train": "train", "val": "dev", "test": "test"}  # raydist split -> VSE++ file prefix
KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


def _load_features(path: Path) -> np.ndarray:
    """A 2-D float feature matrix from ``.npy`` (memory-mapped, not read into memory)."""
    try:
        arr = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise RaydistDataError(f"{path}: cannot read as a .npy array: {e}") from e
    if arr.ndim != 2 or arr.dtype.kind != "f":
        raise RaydistDataError(f"{path}: expected a 2-D float array [rows, dim], got {arr.dtype} {arr.shape}")
    return arr


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
        ims, caps = _load_features(ims_path), _read_captions(caps_path)
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


def _load_feature_ids(path: Path) -> np.ndarray:
    """Image id of each feature row, from ``.npy`` (integers) or ``.json`` (a list of integers)."""
    try:
        if path.suffix == ".json":
            ids = json.loads(path.read_text())
            if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids
            ):
                raise RaydistDataError(f"{path}: expected a JSON list of integer image ids")
            return np.array(ids, dtype=np.int64)
        ids = np.load(path)
    except (OSError, ValueError) as e:
        raise RaydistDataError(f"{path}: cannot read feature ids: {e}") from e
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise RaydistDataError(
            f"{path}: expected a 1-D integer array of image ids, got {ids.dtype} {ids.shape}"
        )
    return ids.astype(np.int64)


def _coco_images(doc: Any, path: Path) -> tuple[dict[int, str | None], dict[int, list[str]]]:
    """``{image id: split field or None}`` and ``{image id: captions}`` from a COCO captions JSON
    (``annotations``) or Karpathy's ``dataset_coco.json`` (``sentences`` inside each image)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise RaydistDataError(f"{path}: expected an object with an 'images' list")
    splits: dict[int, str | None] = {}
    captions: dict[int, list[str]] = defaultdict(list)
    for k, image in enumerate(doc["images"]):
        image_id = image.get("id", image.get("cocoid")) if isinstance(image, dict) else None
        if not isinstance(image_id, int) or isinstance(image_id, bool):
            raise RaydistDataError(f"{path}: images[{k}]: field 'id' (or 'cocoid'): expected an integer")
        if image_id in splits:
            raise RaydistDataError(f"{path}: images[{k}]: duplicate image id {image_id}")
        splits[image_id] = image.get("split")
        for j, sentence in enumerate(image.get("sentences", [])):
            text = sentence.get("raw") if isinstance(sentence, dict) else None
            if not isinstance(text, str):
                raise RaydistDataError(f"{path}: images[{k}].sentences[{j}]: field 'raw': expected a string")
            captions[image_id].append(text)
    for k, ann in enumerate(doc.get("annotations", [])):
        image_id = ann.get("image_id") if isinstance(ann, dict) else None
        if image_id not in splits:
            raise RaydistDataError(
                f"{path}: annotations[{k}]: field 'image_id': {image_id!r} is not in 'images'"
            )
        if not isinstance(ann.get("caption"), str):
            raise RaydistDataError(f"{path}: annotations[{k}]: field 'caption': expected a string")
        captions[image_id].append(ann["caption"])
    for image_id, caps in captions.items():
        for j, text in enumerate(caps):
            if not text.strip():
                raise RaydistDataError(f"{path}: image id {image_id}: caption {j} is empty")
    return splits, captions


def _assign_splits(
    split_field: dict[int, str | None],
    path: Path,
    split_map: Mapping[str, str],
    val_images: int,
    test_images: int,
) -> dict[str, list[int]]:
    """Image ids per split, each sorted: from the ``split`` fields, else the last ``test_images`` ids
    (sorted order) are test and the ``val_images`` before them val."""
    bad = sorted(set(split_map.values()) - set(SPLITS))
    if bad:
        raise RaydistDataError(f"split_map maps to unknown split(s) {bad}; expected values in {list(SPLITS)}")
    ids = sorted(split_field)
    with_field = [i for i in ids if split_field[i] is not None]
    out: dict[str, list[int]] = {s: [] for s in SPLITS}
    if with_field:
        if len(with_field) != len(ids):
            missing = next(i for i in ids if split_field[i] is None)
            raise RaydistDataError(f"{path}: image id {missing} has no 'split' field but others do")
        for i in ids:
            if split_field[i] not in split_map:
                raise RaydistDataError(
                    f"{path}: image id {i}: field 'split': unknown value {split_field[i]!r}; "
                    f"known: {sorted(split_map)}"
                )
            out[split_map[split_field[i]]].append(i)
    else:
        if val_images + test_images >= len(ids):
            raise RaydistDataError(
                f"{path}: {len(ids)} images cannot give {val_images} val + {test_images} test "
                "images and a non-empty train split"
            )
        cut_val, cut_test = len(ids) - test_images - val_images, len(ids) - test_images
        out["train"], out["val"], out["test"] = ids[:cut_val], ids[cut_val:cut_test], ids[cut_test:]
    for split, members in out.items():
        if not members:
            raise RaydistDataError(f"{path}: split {split!r} gets no images")
    return out


def convert_coco_json(
    captions_json: str | Path,
    features: str | Path,
    feature_ids: str | Path,
    out: str | Path,
    *,
    val_images: int = 5000,
    test_images: int = 5000,
    split_map: Mapping[str, str] | None = None,
    min_count: int = 4,
    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
    overwrite: bool = False,
) -> Path:
    """Convert COCO-style captions + a feature matrix keyed by image id.

    ``captions_json``: ``{"images": [{"id", ("split")}], "annotations": [{"image_id", "caption"}]}`` or
    Karpathy's ``dataset_coco.json`` (``cocoid``, ``split``, ``sentences[].raw``). ``features``: ``.npy``
    ``[M, D]``; ``feature_ids``: image id of each feature row (``.npy`` or JSON list). Splits: when the
    images carry a ``split`` field it is mapped by ``split_map`` (default: train/restval → train,
    val → val, test → test); otherwise images are sorted by id and the last ``test_images`` are test,
    the ``val_images`` before them val, the rest train. Rows: images in id order, captions in file
    order; image_id is the COCO id, sample_id a running row number. An image without features or
    without captions is an error naming it; feature rows of images absent from the JSON are unused
    (their count is recorded in the manifest's ``source``). Returns ``out``.
    """
    json_path, feats_path, ids_path = Path(captions_json), Path(features), Path(feature_ids)
    try:
        doc = json.loads(json_path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RaydistDataError(f"{json_path}: cannot read captions JSON: {e}") from e
    split_field, captions = _coco_images(doc, json_path)
    feats, ids = _load_features(feats_path), _load_feature_ids(ids_path)
    if len(ids) != feats.shape[0]:
        raise RaydistDataError(
            f"{ids_path} lists {len(ids)} image ids but {feats_path} has {feats.shape[0]} rows"
        )
    uniq, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise RaydistDataError(
            f"{ids_path}: image id {int(uniq[counts > 1][0])} has more than one feature row"
        )
    row_of = {int(i): r for r, i in enumerate(ids)}
    for image_id in sorted(split_field):
        if image_id not in row_of:
            raise RaydistDataError(f"{json_path}: image id {image_id} has no feature row in {ids_path}")
        if not captions.get(image_id):
            raise RaydistDataError(f"{json_path}: image id {image_id} has no captions")
    members = _assign_splits(split_field, json_path, split_map or KARPATHY_SPLITS, val_images, test_images)
    source: dict[str, Any] = {
        "converter": "coco_json",
        "captions_json": str(json_path.resolve()),
        "features": str(feats_path.resolve()),
        "feature_ids": str(ids_path.resolve()),
        "min_count": min_count,
        "unused_feature_rows": len(ids) - len(split_field),
        "split_rule": "split field"
        if split_field[members["train"][0]] is not None
        else f"sorted ids: last {test_images} test, {val_images} before them val",
    }
    with DatasetWriter(out, rows_per_shard=rows_per_shard, source=source, overwrite=overwrite) as writer:
        writer.vocab = Vocab.build((c for i in members["train"] for c in captions[i]), min_count)
        first_sample = 0
        for split in SPLITS:
            image_ids = np.array([i for i in members[split] for _ in captions[i]], dtype=np.int64)
            texts = [c for i in members[split] for c in captions[i]]
            rows = np.array([row_of[int(i)] for i in image_ids], dtype=np.int64)
            writer.add_split(
                split, image_ids, first_sample + np.arange(len(texts)), feats, texts, feature_index=rows
            )
            first_sample += len(texts)
    return Path(out)
