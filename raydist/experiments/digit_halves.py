"""A small real cross-view retrieval set: scikit-learn's 1797 handwritten 8×8 digits cut in halves, the left
half as "image" features and the right half as a "caption" of pixel words, written as a pairs dataset.

View 1 (32-d): rows 0–7 × columns 0–3, intensity / 16 (in [0, 1]). View 2: one word ``r{row}c{col}`` (col
4–7) per pixel with intensity >= 8 of 16 (half ink), row-major: "r1c4 r1c5 r2c6 …" (2–19 words, 10.7 on
average; 32 possible words). One caption per image; image_id = sample_id = the index in ``load_digits``.
The vocab keeps every train word (min count 1): each word is a pixel position, and a rare one still carries
its position (with ``convert``'s min count 4, "r2c7", seen once in train, would become ``<unk>``).
Needs scikit-learn (the ``experiments`` extra).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raydist.data import DatasetWriter, Vocab

INK_THRESHOLD = 8  # of 16: a right-half pixel at least half inked becomes a word
SPLIT_SIZES = {"val": 300, "test": 397}  # the rest (1100 of 1797) is train


def caption_of(right_half: np.ndarray, threshold: int = INK_THRESHOLD) -> str:
    """Words ``r{row}c{col}`` (col 4–7) for the pixels of an 8×4 right half with intensity >= ``threshold``,
    row-major; ``"blank"`` when none is inked (never happens at the default threshold)."""
    rows, cols = np.nonzero(right_half >= threshold)
    words = [f"r{r}c{c + 4}" for r, c in zip(rows, cols, strict=False)]
    return " ".join(words) or "blank"


def digit_halves(threshold: int = INK_THRESHOLD) -> tuple[np.ndarray, list[str], np.ndarray]:
    """All 1797 digits as (left-half features float32 [N, 32] in [0, 1], right-half captions, class labels)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images  # [N, 8, 8], intensities 0–16
    features = (images[:, :, :4].reshape(len(images), 32) / 16.0).astype(np.float32)
    captions = [caption_of(img[:, 4:], threshold) for img in images]
    return features, captions, digits.target.astype(np.int64)


def split_indices(n: int, seed: int = 0, sizes: dict[str, int] = SPLIT_SIZES) -> dict[str, np.ndarray]:
    """Seeded permutation of ``range(n)`` cut into val and test of ``sizes`` and train (the rest), each sorted."""
    order = np.random.default_rng(seed).permutation(n)
    val, test = sizes["val"], sizes["test"]
    if n <= val + test:
        raise ValueError(f"{n} samples leave no train split after {val} val + {test} test")
    parts = {
        "train": order[: n - val - test],
        "val": order[n - val - test : n - test],
        "test": order[n - test :],
    }
    return {k: np.sort(v) for k, v in parts.items()}


def write_digit_halves(
    out: str | Path,
    *,
    seed: int = 0,
    limit: int | None = None,
    sizes: dict[str, int] = SPLIT_SIZES,
    threshold: int = INK_THRESHOLD,
    overwrite: bool = True,
) -> Path:
    """Write the digit-halves set to ``out`` with :class:`~raydist.data.DatasetWriter` (split by ``seed``: 1100
    train / 300 val / 397 test digits; vocab from train, min count 1); ``limit`` keeps the first ``limit``
    digits (for tests). Returns ``out``."""
    features, captions, _ = digit_halves(threshold)
    n = len(captions) if limit is None else min(limit, len(captions))
    parts = split_indices(n, seed, sizes)
    source = {
        "generator": "raydist.experiments.digit_halves",
        "data": "sklearn.datasets.load_digits",
        "seed": seed,
        "limit": limit,
        "ink_threshold": threshold,
        "image": "left half / 16 (rows 0-7, cols 0-3)",
        "caption": "right half: r{row}c{col} per pixel >= threshold, row-major",
    }
    with DatasetWriter(out, source=source, overwrite=overwrite) as writer:
        writer.vocab = Vocab.build((captions[i] for i in parts["train"]), min_count=1)
        for split, idx in parts.items():
            writer.add_split(split, idx, idx, features[idx], [captions[i] for i in idx])
    return Path(out)
