"""Converters from image files into ``encoded`` datasets (the files' PNG/JPEG bytes, not re-encoded): Karpathy's
split JSON and COCO captions JSON (task ``pairs``, one row per image with its captions), and a torchvision
ImageFolder tree (task ``labels``). Every image is decoded in full before it is written."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raydist.console import say
from raydist.data.convert import KARPATHY_SPLITS, _assign_splits, _coco_images
from raydist.data.image_bytes import ImageFiles
from raydist.data.labels_io import _stratified_split
from raydist.data.schema import DEFAULT_IMAGES_PER_SHARD, SPLITS, RaydistDataError
from raydist.data.shards import DatasetWriter, WriteRefused
from raydist.data.vocab import Vocab

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")  # ImageFolder: files with these suffixes (any case) are images
SPLIT_BY = ("class", "image")


@dataclass(frozen=True)
class _Captioned:
    """One image of a pairs dataset: its id, file, captions (stripped) and where the JSON names it."""

    image_id: int
    path: Path
    captions: list[str]
    where: str


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RaydistDataError(f"{path}: cannot read JSON: {e}") from e


def _check_files(images: list[tuple[Path, str | None]], src: str | Path) -> None:
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


def _write_pairs(
    out: str | Path,
    members: Mapping[str, list[_Captioned]],
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
    _check_files([(m.path, m.where) for split in SPLITS for m in members[split]], source["src"])
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


def _karpathy_captions(entry: dict[str, Any], where: str) -> list[str]:
    """An image's captions: each sentence's ``raw`` stripped, or its ``tokens`` joined by spaces."""
    captions = []
    for j, sentence in enumerate(entry.get("sentences") or []):
        raw = sentence.get("raw") if isinstance(sentence, dict) else None
        tokens = sentence.get("tokens") if isinstance(sentence, dict) else None
        if isinstance(raw, str):
            text = raw.strip()
        elif isinstance(tokens, list) and all(isinstance(t, str) for t in tokens):
            text = " ".join(tokens).strip()
        else:
            raise RaydistDataError(
                f"{where}: sentences[{j}]: expected 'raw' (a string) or 'tokens' (strings)"
            )
        if not text:
            raise RaydistDataError(f"{where}: sentences[{j}]: empty caption")
        captions.append(text)
    if not captions:
        raise RaydistDataError(f"{where}: image without captions ('sentences' is missing or empty)")
    return captions


def _karpathy_image_ids(entries: list[dict[str, Any]], path: Path) -> tuple[list[int], str]:
    """Image ids: ``cocoid`` when every image has one, else ``imgid`` when every image has one, else the
    image's position in the file; and the rule's name. Ids must be unique."""
    for name in ("cocoid", "imgid"):
        ids = [e.get(name) for e in entries]
        if all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            break
    else:
        ids, name = list(range(len(entries))), "position in the file"
    seen: dict[int, int] = {}
    for k, image_id in enumerate(ids):
        if image_id in seen:
            raise RaydistDataError(
                f"{path}: images[{k}]: {name} {image_id} repeats images[{seen[image_id]}]'s"
            )
        seen[image_id] = k
    return ids, name


def convert_karpathy(
    src: str | Path,
    images: str | Path,
    out: str | Path,
    *,
    min_count: int = 4,
    rows_per_shard: int = DEFAULT_IMAGES_PER_SHARD,
    overwrite: bool = False,
) -> Path:
    """Convert a Karpathy split JSON (``dataset_flickr8k.json``, ``dataset_flickr30k.json``,
    ``dataset_coco.json``, as VSE++ uses) and its image files into an encoded pairs dataset; return ``out``.

    ``src``: ``{"images": [{"filepath"?, "filename", "split", "sentences": [{"raw", "tokens"}], "imgid"?,
    "cocoid"?}]}``. The image file is ``images/filepath/filename`` (``images/filename`` without a filepath).
    Splits: ``train`` and ``restval`` → train, ``val``, ``test``; rows keep the file's order within a split.
    Captions: ``raw`` stripped, else the ``tokens`` joined. Image ids: see :func:`_karpathy_image_ids`.
    Errors name the file and the image: a missing, empty, corrupt or non-PNG/JPEG image file, an image with
    no or an unknown split, an image without captions. The vocab is built from the train captions.
    """
    path, root = Path(src), Path(images)
    doc = _read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise RaydistDataError(f"{path}: expected an object with an 'images' list")
    entries = doc["images"]
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("filename"), str):
            raise RaydistDataError(f"{path}: images[{k}]: field 'filename': expected a string")
    ids, id_rule = _karpathy_image_ids(entries, path)
    members: dict[str, list[_Captioned]] = {s: [] for s in SPLITS}
    for k, (entry, image_id) in enumerate(zip(entries, ids, strict=False)):
        name = str(Path(entry.get("filepath") or "") / entry["filename"])
        where = f"{path}: images[{k}] ({name})"
        split = entry.get("split")
        if split not in KARPATHY_SPLITS:
            found = "missing" if split is None else f"unknown value {split!r}"
            raise RaydistDataError(
                f"{where}: field 'split': {found}; expected one of {sorted(KARPATHY_SPLITS)}"
            )
        members[KARPATHY_SPLITS[split]].append(
            _Captioned(image_id, root / name, _karpathy_captions(entry, where), where)
        )
    source = {
        "converter": "karpathy",
        "src": str(path.resolve()),
        "images": str(root.resolve()),
        "min_count": min_count,
        "image_id": id_rule,
        "split_rule": "split field (restval -> train)",
    }
    return _write_pairs(
        out, members, min_count=min_count, source=source, rows_per_shard=rows_per_shard, overwrite=overwrite
    )


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
    doc = _read_json(path)
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
            _Captioned(
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
    return _write_pairs(
        out, members, min_count=min_count, source=source, rows_per_shard=rows_per_shard, overwrite=overwrite
    )


def _class_folders(folder: Path, ignored: Counter[str]) -> dict[str, list[Path]]:
    """``{class name: image files}`` of an ImageFolder tree (``folder/<class>/**/<file>``, sorted); other files
    are counted in ``ignored`` by suffix. A class folder without images is an error naming it."""
    classes: dict[str, list[Path]] = {}
    for entry in sorted(folder.iterdir()):
        if not entry.is_dir():
            ignored[entry.suffix.lower() or "no suffix"] += 1
            continue
        files = sorted(p for p in entry.rglob("*") if p.is_file())
        images = [p for p in files if p.suffix.lower() in IMAGE_EXTENSIONS]
        ignored.update(
            p.suffix.lower() or "no suffix" for p in files if p.suffix.lower() not in IMAGE_EXTENSIONS
        )
        if not images:
            raise RaydistDataError(f"{entry}: empty class folder (no {'/'.join(IMAGE_EXTENSIONS)} files)")
        classes[entry.name] = images
    if not classes:
        raise RaydistDataError(f"{folder}: no class folders (expected {folder}/<class>/<image files>)")
    return classes


def _class_split(
    num_classes: int, val_fraction: float, test_fraction: float, seed: int, where: Path
) -> np.ndarray:
    """Split name per class for disjoint classes per split (the CUB/Cars/SOP protocol): in a seeded random
    order, ``round(K·test_fraction)`` classes test, ``round(K·val_fraction)`` val (at least one each), the
    rest train (at least one)."""
    n_test = max(1, int(np.floor(num_classes * test_fraction + 0.5)))
    n_val = max(1, int(np.floor(num_classes * val_fraction + 0.5)))
    if num_classes - n_test - n_val < 1:
        raise RaydistDataError(
            f"{where}: {num_classes} classes cannot give {n_val} val, {n_test} test and at "
            "least one train class (--split-by class)"
        )
    order = np.random.default_rng(seed).permutation(num_classes)
    out = np.empty(num_classes, dtype=object)
    out[order] = np.repeat(
        np.array(["test", "val", "train"], dtype=object), [n_test, n_val, num_classes - n_test - n_val]
    )
    return out


def convert_image_folder(
    src: str | Path,
    out: str | Path,
    *,
    split_by: str = "image",
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
    rows_per_shard: int = DEFAULT_IMAGES_PER_SHARD,
    overwrite: bool = False,
) -> Path:
    """Convert a torchvision ImageFolder tree into an encoded labels dataset; return ``out``.

    ``src/<class>/**/<file>``: files ending in .png/.jpg/.jpeg (any case) are images, other files are ignored
    (counted, reported in one line and recorded in the manifest's ``source``). When ``src/train``, ``src/val``
    and ``src/test`` exist they are the splits, each an ImageFolder tree; otherwise a seeded split of
    ``src``: ``split_by="image"`` stratified per class (:func:`raydist.data.labels_io._stratified_split`),
    ``split_by="class"`` disjoint classes per split. Classes (the union over the splits) sorted by name are
    labels 0..K-1; their names are the manifest's ``source.classes``. Rows: by class, then file path;
    ``image_id`` = ``sample_id`` = the row's position in that order over train, val, test (pre-split) or
    over ``src``. An empty class folder, a missing split folder or an empty split is an error naming it.
    """
    src = Path(src)
    if split_by not in SPLIT_BY:
        raise RaydistDataError(f"split_by must be one of {list(SPLIT_BY)}, got {split_by!r}")
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise RaydistDataError(
            f"val_fraction and test_fraction must be > 0 with a sum < 1, got {val_fraction} "
            f"and {test_fraction}"
        )
    if not src.is_dir():
        raise RaydistDataError(f"{src}: not a folder")
    ignored: Counter[str] = Counter()
    present = [s for s in SPLITS if (src / s).is_dir()]
    if present:
        if len(present) < len(SPLITS):
            missing = [s for s in SPLITS if s not in present]
            raise RaydistDataError(
                f"{src}: has split folder(s) {present} but not {missing}; give train/, val/ "
                "and test/ (each <class>/<files>) or only class folders"
            )
        ignored.update(p.suffix.lower() or "no suffix" for p in src.iterdir() if p.is_file())
        trees = {split: _class_folders(src / split, ignored) for split in SPLITS}
        classes = sorted({name for tree in trees.values() for name in tree})
        label = {name: k for k, name in enumerate(classes)}
        rows = [
            (split, path, label[name])
            for split in SPLITS
            for name, paths in sorted(trees[split].items())
            for path in paths
        ]
        split_rule = "split folders"
    else:
        tree = _class_folders(src, ignored)
        classes = sorted(tree)
        files = [(path, k) for k, name in enumerate(classes) for path in tree[name]]
        labels = np.array([k for _, k in files], dtype=np.int64)
        if split_by == "class":
            split_of = _class_split(len(classes), val_fraction, test_fraction, seed, src)[labels]
        else:
            split_of = _stratified_split(labels, val_fraction, test_fraction, seed)
        rows = [(split_of[r], path, k) for r, (path, k) in enumerate(files)]
        split_rule = (
            f"seeded split by {split_by}: val_fraction {val_fraction}, test_fraction {test_fraction}, "
            f"seed {seed}"
        )
    if ignored:
        counts = ", ".join(f"{suffix}: {n}" for suffix, n in sorted(ignored.items()))
        say(
            f"{src}: ignored {sum(ignored.values())} file(s) that are not {'/'.join(IMAGE_EXTENSIONS)} images "
            f"({counts})"
        )
    source = {
        "converter": "image_folder",
        "src": str(src.resolve()),
        "classes": classes,
        "split_rule": split_rule,
        "ignored_files": dict(sorted(ignored.items())),
    }
    for split in SPLITS:
        if not any(row[0] == split for row in rows):
            raise RaydistDataError(f"{src}: split {split!r} gets no images ({split_rule})")
    _check_files([(path, None) for _, path, _ in rows], src)
    with DatasetWriter(
        out,
        task="labels",
        num_classes=len(classes),
        rows_per_shard=rows_per_shard,
        source=source,
        overwrite=overwrite,
        all_problems=True,
    ) as writer:
        for split in SPLITS:
            ids = np.array([r for r, row in enumerate(rows) if row[0] == split], dtype=np.int64)
            paths = [rows[r][1] for r in ids]
            writer.add_split(
                split,
                ids,
                ids,
                ImageFiles(paths),
                labels=np.array([rows[r][2] for r in ids]),
                image_sources=[str(p) for p in paths],
            )
    return Path(out)
