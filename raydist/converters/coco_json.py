"""``raydist convert coco-json``: COCO-style captions JSON with its images (an encoded pairs dataset) or with a
feature matrix (a feature pairs dataset)."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from raydist.converters import Converter, add_min_count, add_splits, register_converter, split_pairs
from raydist.converters.source_files import (
    KARPATHY_SPLITS,
    CaptionedImage,
    load_features,
    read_json,
    write_pairs,
)
from raydist.data.schema import DEFAULT_IMAGES_PER_SHARD, DEFAULT_ROWS_PER_SHARD, SPLITS, RaydistDataError
from raydist.data.shards import DatasetWriter
from raydist.data.vocab import Vocab


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
    feats, ids = load_features(feats_path), _load_feature_ids(ids_path)
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


def convert_coco_images(
    captions_json: str | Path,
    images: str | Path,
    out: str | Path,
    *,
    val_images: int = 5000,
    test_images: int = 5000,
    split_map: Mapping[str, str] | None = None,
    min_count: int = 4,
    rows_per_shard: int = DEFAULT_IMAGES_PER_SHARD,
    overwrite: bool = False,
) -> Path:
    """Convert a COCO captions JSON and its image folder into an encoded pairs dataset; return ``out``.

    ``captions_json`` as :func:`raydist.data.convert_coco_json` reads it (ids, captions and splits the same
    way: a ``split`` field mapped by ``split_map``, else by sorted id the last ``test_images`` test and the
    ``val_images`` before them val); each image's file is ``images/file_name`` (COCO) or
    ``images/filepath/filename`` (Karpathy's ``dataset_coco.json``). One row per image, in id order, with its
    captions stripped and in file order. Errors name the file and the image id or file.
    """
    path, root = Path(captions_json), Path(images)
    doc = read_json(path)
    split_field, captions = _coco_images(doc, path)
    files: dict[int, Path] = {}
    for k, entry in enumerate(doc["images"]):
        name = entry.get("file_name", entry.get("filename"))
        if not isinstance(name, str):
            raise RaydistDataError(f"{path}: images[{k}]: field 'file_name': expected a string")
        files[entry.get("id", entry.get("cocoid"))] = root / (entry.get("filepath") or "") / name
    for image_id in sorted(split_field):
        if not captions.get(image_id):
            raise RaydistDataError(f"{path}: image id {image_id} ({files[image_id].name}) has no captions")
    splits = _assign_splits(split_field, path, split_map or KARPATHY_SPLITS, val_images, test_images)
    members = {
        split: [
            CaptionedImage(
                i, files[i], [c.strip() for c in captions[i]], f"{path}: image id {i} ({files[i].name})"
            )
            for i in ids
        ]
        for split, ids in splits.items()
    }
    with_field = split_field[splits["train"][0]] is not None
    source = {
        "converter": "coco_images",
        "src": str(path.resolve()),
        "images": str(root.resolve()),
        "min_count": min_count,
        "split_rule": "split field"
        if with_field
        else f"sorted ids: last {test_images} test, {val_images} before them val",
    }
    return write_pairs(
        out, members, min_count=min_count, source=source, rows_per_shard=rows_per_shard, overwrite=overwrite
    )


@register_converter("coco-json")
class CocoJson(Converter):
    """COCO / Karpathy-style captions JSON with an image folder (encoded pairs) or a feature matrix."""

    requires = ("captions",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--captions", help="captions JSON file")
        parser.add_argument(
            "--images", help="image folder (DIR/file_name), instead of --features/--feature-ids"
        )
        parser.add_argument("--features", help=".npy feature matrix, one row per image")
        parser.add_argument("--feature-ids", help=".npy/.json image id of each feature row")
        add_min_count(parser)
        parser.add_argument("--val-images", type=int, default=5000)
        parser.add_argument("--test-images", type=int, default=5000)
        add_splits(
            parser, "values of the images' 'split' field; a split may repeat: train=train,train=restval"
        )

    def run(self, args: argparse.Namespace) -> Path:
        if bool(args.images) == bool(args.features or args.feature_ids):
            raise ValueError("convert coco-json: give either --images DIR or --features and --feature-ids")
        pairs = split_pairs(args.splits)
        common = {
            "min_count": args.min_count,
            "val_images": args.val_images,
            "test_images": args.test_images,
            "split_map": {src: dst for dst, src in pairs} if pairs else None,
            "overwrite": args.overwrite,
        }
        if args.images:
            return convert_coco_images(args.captions, args.images, args.out, **common)
        return convert_coco_json(args.captions, args.features, args.feature_ids, args.out, **common)
