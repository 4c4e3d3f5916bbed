"""``raydist convert image-folder``: a torchvision ImageFolder tree of class folders into an encoded labels
dataset."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np

from raydist.console import say
from raydist.converters import Converter, add_seeded_split, register_converter, seeded_split
from raydist.converters.source_files import check_files, stratified_split
from raydist.data.image_bytes import ImageFiles
from raydist.data.schema import DEFAULT_IMAGES_PER_SHARD, SPLITS, RaydistDataError
from raydist.data.shards import DatasetWriter

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")  # ImageFolder: files with these suffixes (any case) are images


SPLIT_BY = ("class", "image")


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
    ``src``: ``split_by="image"`` stratified per class (:func:`raydist.data.labels_io.stratified_split`),
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
            split_of = stratified_split(labels, val_fraction, test_fraction, seed)
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
    check_files([(path, None) for _, path, _ in rows], src)
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


@register_converter("image-folder")
class ImageFolder(Converter):
    """An ImageFolder tree, DIR/<class>/<images> (or DIR/train, DIR/val, DIR/test) → an encoded labels dataset."""

    requires = ("src",)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--src", help="DIR/<class>/<images> (or DIR/train, DIR/val, DIR/test)")
        parser.add_argument(
            "--split-by",
            choices=["class", "image"],
            default="image",
            help="without split folders: disjoint classes per split, or stratified by class",
        )
        add_seeded_split(
            parser, "without split folders", "each class's images (--split-by image) or of the classes"
        )

    def run(self, args: argparse.Namespace) -> Path:
        return convert_image_folder(
            args.src,
            args.out,
            split_by=args.split_by,
            overwrite=args.overwrite,
            **seeded_split(args),
        )
