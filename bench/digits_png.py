"""A real small image set for `raydist train --data`, offline: scikit-learn's digits as PNG files, and the
raw-pixel baseline to beat.

    python bench/digits_png.py write OUT_SRC [SIZE]      # 1,797 greyscale PNGs (8×8, or upscaled to SIZE²)
    raydist convert image-folder --src OUT_SRC --out DATA --split-by image
    python bench/digits_png.py baseline DATA [SPLIT]     # raw-pixel 1-NN of SPLIT (default test)
    python bench/digits_png.py splits OUT_SRC SIZE [SEED]  # the same digits in train/ val/ test/ folders
    python bench/digits_png.py halves OUT_SRC SIZE       # left halves (SIZE×SIZE/2 PNGs) + dataset_digits.json
    raydist convert karpathy --src OUT_SRC/dataset_digits.json --images OUT_SRC --out DATA
    python bench/digits_png.py backbone RUN OUT.pth       # a run's trained image backbone as a state-dict file

``splits`` and ``halves`` share one seeded split of the 1,797 digits (1,100 train, 300 val, 397 test; that
of :mod:`raydist.experiments.digit_halves`), so the labels task and the pairs task see the same test digits;
``splits`` takes another split seed (default 0) to measure how much a result owes to the one split.
A half's caption names the right half's inked pixels of the 8×8 scan (``r{row}c{col}``, the digit halves'
words). The baseline is the protocol the run reports as `nn1`: each image of the split against the split's
other images, cosine similarity, the nearest one's label. Needs scikit-learn (the `experiments` or `dev`
extra).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def digit_pixels(size: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as uint8 [N, size, size] (16 grey levels scaled to 0–255, then resized bilinearly
    from 8×8 when ``size`` != 8) and their labels."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    scans = (digits.images * 255 / 16).round().astype(np.uint8)
    if size != 8:
        scans = np.stack(
            [
                np.asarray(Image.fromarray(s, mode="L").resize((size, size), Image.Resampling.BILINEAR))
                for s in scans
            ]
        )
    return scans, digits.target


def _save(pixels: np.ndarray, path: Path) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, mode="L").save(path)


def write(root: Path, size: int = 8) -> None:
    """The digits as ``root/<digit>/<index>.png`` (one folder per class, no split)."""
    scans, labels = digit_pixels(size)
    for k, (image, label) in enumerate(zip(scans, labels, strict=False)):
        _save(image, root / str(label) / f"{k:04d}.png")
    print(f"wrote {len(scans)} {size}×{size} PNGs under {root}")


def splits(root: Path, size: int, seed: int = 0) -> None:
    """The digits as ``root/{train,val,test}/<digit>/<index>.png`` on the digit halves' split (``seed`` 0) or
    another split of the same sizes (``seed``)."""
    from raydist.experiments.digit_halves import split_indices

    scans, labels = digit_pixels(size)
    for split, idx in split_indices(len(scans), seed).items():
        for k in idx:
            _save(scans[k], root / split / str(labels[k]) / f"{k:04d}.png")
    print(f"wrote {len(scans)} {size}×{size} PNGs under {root}/{{train,val,test}} (split seed {seed})")


def halves(root: Path, size: int) -> None:
    """Each digit's left half (the 8×4 scan's, resized to ``size`` × ``size // 2``: cut first, so no pixel of the
    right half reaches the image through the interpolation) as ``root/halves/<index>.png`` and a Karpathy split
    JSON whose one caption per image names the right half's inked pixels, on the digit halves' split."""
    from PIL import Image
    from sklearn.datasets import load_digits

    from raydist.experiments.digit_halves import caption_of, split_indices

    images = load_digits().images
    left = (
        (images[:, :, :4] * 255 / 16).round().astype(np.uint8)
    )  # cut before resizing: no right-half pixel leaks
    entries = []
    for split, idx in split_indices(len(images)).items():
        for k in idx:
            half = Image.fromarray(left[k], mode="L").resize((size // 2, size), Image.Resampling.BILINEAR)
            _save(np.asarray(half), root / "halves" / f"{k:04d}.png")
            entries.append(
                {
                    "filepath": "halves",
                    "filename": f"{k:04d}.png",
                    "split": split,
                    "imgid": int(k),
                    "sentences": [{"raw": caption_of(images[k][:, 4:])}],
                }
            )
    (root / "dataset_digits.json").write_text(json.dumps({"images": entries}))
    print(f"wrote {len(entries)} {size}×{size // 2} left halves and {root}/dataset_digits.json")


def baseline(data: Path, split: str) -> None:
    """Raw-pixel 1-NN accuracy (leave one out, cosine) of ``split`` of an encoded labels dataset."""
    from raydist.data import read_split
    from raydist.data.image_transforms import decode_image
    from raydist.eval.label_metrics import one_nn_accuracy

    table = read_split(data, split)
    pixels = np.stack(
        [decode_image(b, 1).astype(np.float64).ravel() for b in table.column("image").to_pylist()]
    )
    labels = np.asarray(table.column("label").to_pylist())
    unit = pixels / np.linalg.norm(pixels, axis=1, keepdims=True)
    print(f"{split}: {len(labels)} images; raw-pixel 1-NN (cosine): {one_nn_accuracy(unit, labels):.1f} %")


def backbone(run: Path, out: Path) -> None:
    """The image encoder's backbone of ``run``'s best checkpoint, keys as the bare model names them (what
    ``model.image_weights`` loads): pre-training on one set, then fine-tuning on another."""
    import torch

    from raydist.checkpoint import load_checkpoint
    from raydist.retrieval.trained import choose_trained

    chosen = choose_trained(run)
    state = load_checkpoint(chosen.path)[0]["model"]
    trunk = {k.split(".backbone.", 1)[1]: v for k, v in state.items() if ".backbone." in k}
    if not trunk:
        sys.exit(f"{run}: the checkpoint's model has no image backbone")
    torch.save(trunk, out)
    print(f"wrote {out}: {len(trunk)} tensors of the image backbone of {chosen}")


if __name__ == "__main__":
    commands = {"write": 3, "baseline": 3, "backbone": 4, "splits": 4, "halves": 4}
    if len(sys.argv) < 3 or commands.get(sys.argv[1], 99) > len(sys.argv):
        sys.exit(__doc__)
    command, first = sys.argv[1], Path(sys.argv[2])
    if command == "write":
        write(first, int(sys.argv[3]) if len(sys.argv) > 3 else 8)
    elif command == "splits":
        splits(first, int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 0)
    elif command == "halves":
        halves(first, int(sys.argv[3]))
    elif command == "backbone":
        backbone(first, Path(sys.argv[3]))
    else:
        baseline(first, sys.argv[3] if len(sys.argv) > 3 else "test")
