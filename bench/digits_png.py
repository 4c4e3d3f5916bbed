"""A real small image set for `raydist train --data`, offline: scikit-learn's digits as PNG files, and the
raw-pixel baseline to beat.

    python bench/digits_png.py write OUT_SRC            # 1,797 8×8 greyscale PNGs, one folder per digit
    raydist convert image-folder --src OUT_SRC --out DATA --split-by image
    python bench/digits_png.py baseline DATA [SPLIT]     # raw-pixel 1-NN of SPLIT (default test)
    python bench/digits_png.py backbone RUN OUT.pth       # a run's trained image backbone as a state-dict file

The baseline is the protocol the run reports as `nn1`: each image of the split against the split's other images,
cosine similarity, the nearest one's label. Needs scikit-learn (the `experiments` or `dev` extra).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def write(root: Path) -> None:
    """The digits (16 grey levels scaled to 0–255) as ``root/<digit>/<index>.png``."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for k, (image, label) in enumerate(zip(digits.images, digits.target)):
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((image * 255 / 16).round().astype(np.uint8), mode="L").save(folder / f"{k:04d}.png")
    print(f"wrote {len(digits.images)} PNGs under {root}")


def baseline(data: Path, split: str) -> None:
    """Raw-pixel 1-NN accuracy (leave one out, cosine) of ``split`` of an encoded labels dataset."""
    from raydist.data import read_split
    from raydist.data.image_transforms import decode_image
    from raydist.eval.label_metrics import one_nn_accuracy

    table = read_split(data, split)
    pixels = np.stack([decode_image(b, 1).astype(np.float64).ravel() for b in table.column("image").to_pylist()])
    labels = np.asarray(table.column("label").to_pylist())
    unit = pixels / np.linalg.norm(pixels, axis=1, keepdims=True)
    print(f"{split}: {len(labels)} images; raw-pixel 1-NN (cosine): {one_nn_accuracy(unit, labels):.1f} %")


def backbone(run: Path, out: Path) -> None:
    """The image encoder's backbone of ``run``'s best checkpoint, keys as the bare model names them (what
    ``model.image_weights`` loads): pre-training on one set, then fine-tuning on another."""
    import torch

    from raydist.checkpoint import load_checkpoint
    from raydist.inference import choose_checkpoint

    chosen = choose_checkpoint(run)
    state = load_checkpoint(chosen.path)[0]["model"]
    trunk = {k.split(".backbone.", 1)[1]: v for k, v in state.items() if ".backbone." in k}
    if not trunk:
        sys.exit(f"{run}: the checkpoint's model has no image backbone")
    torch.save(trunk, out)
    print(f"wrote {out}: {len(trunk)} tensors of the image backbone of {chosen}")


if __name__ == "__main__":
    commands = {"write": 3, "baseline": 3, "backbone": 4}
    if len(sys.argv) < 3 or commands.get(sys.argv[1], 99) > len(sys.argv):
        sys.exit(__doc__)
    if sys.argv[1] == "write":
        write(Path(sys.argv[2]))
    elif sys.argv[1] == "backbone":
        backbone(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        baseline(Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "test")
