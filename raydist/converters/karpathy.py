"""``raydist convert karpathy``: Karpathy's split JSON (Flickr8k, Flickr30k, COCO) and its image files into an
encoded pairs dataset (the files' bytes, not re-encoded; every image decoded in full before it is written)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from raydist.converters import Converter, add_min_count, register_converter
from raydist.converters.source_files import KARPATHY_SPLITS, CaptionedImage, read_json, write_pairs
from raydist.data.schema import DEFAULT_IMAGES_PER_SHARD, SPLITS, RaydistDataError


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
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise RaydistDataError(f"{path}: expected an object with an 'images' list")
    entries = doc["images"]
    for k, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("filename"), str):
            raise RaydistDataError(f"{path}: images[{k}]: field 'filename': expected a string")
    ids, id_rule = _karpathy_image_ids(entries, path)
    members: dict[str, list[CaptionedImage]] = {s: [] for s in SPLITS}
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
            CaptionedImage(image_id, root / name, _karpathy_captions(entry, where), where)
        )
    source = {
        "converter": "karpathy",
        "src": str(path.resolve()),
        "images": str(root.resolve()),
        "min_count": min_count,
        "image_id": id_rule,
        "split_rule": "split field (restval -> train)",
    }
    return write_pairs(
        out, members, min_count=min_count, source=source, rows_per_shard=rows_per_shard, overwrite=overwrite
    )


@register_converter("karpathy")
class Karpathy(Converter):
    """Karpathy's dataset_*.json (Flickr8k, Flickr30k, COCO) and its images → an encoded pairs dataset."""

    requires = ("src", "images")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--src", help="dataset_*.json")
        parser.add_argument("--images", help="image root (ROOT/filepath/filename)")
        add_min_count(parser)

    def run(self, args: argparse.Namespace) -> Path:
        return convert_karpathy(
            args.src, args.images, args.out, min_count=args.min_count, overwrite=args.overwrite
        )
