"""Small real cross-view retrieval set (scikit-learn's 1797 handwritten 8×8 digits cut in halves): linear
baselines vs raydist training with the shipped presets and schedule variants.

View 1 ("image", 32-d): the left half of a digit, rows 0–7 × columns 0–3, intensities / 16 (in [0, 1]).
View 2 ("caption"): the right half as words, one per inked pixel (intensity >= 8 of 16, i.e. half ink),
``r{row}c{col}`` with col in 4–7, in row-major order: "r1c4 r1c5 r2c6 …" (2–19 words, 10.7 on average;
32 possible words). One caption per image; image_id = sample_id = the index in ``load_digits``.
Split: a permutation seeded by ``--seed`` gives 1100 train / 300 val / 397 test digits.
The vocab keeps every train word (min count 1): VSE++'s converters drop words seen fewer than 4 times
(raydist's ``convert`` default ``min_count=4``), but here every word is a pixel position and a rare one
still carries its position (with 4, "r2c7", seen once in train, would become ``<unk>``); the train vocab
has 29 of the 32 positions.

Baselines (fitted on train, evaluated on test with the VSE++ protocol, ``retrieval_metrics``):
``cca16`` = 16-component CCA between the features and the caption bag-of-words, both views projected
and L2-normalised; ``lsq`` = ridge least-squares map features → bag-of-words (centred), scored by the
cosine between the predicted and the real bag-of-words.

    pip install scikit-learn        # the experiments-only dependency (the `experiments` extra)
    python bench/real_cross_view.py --out /tmp/digits-halves [--variants default,small ...] [--list]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")

from raydist.data import DatasetWriter, Vocab, split_arrays, tokenize
from raydist.eval.metrics import retrieval_metrics

INK_THRESHOLD = 8  # of 16: a right-half pixel at least half inked becomes a word
SPLIT_SIZES = {"val": 300, "test": 397}  # the rest (1100 of 1797) is train
KEYS = ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "rsum")

# Variants: name → (preset, dotted overrides); every run also gets data.path, train.storage_path,
# train.tensorboard=false and eval.folds=1 (all 397 test digits; vsepp-coco.yaml sets folds=5).
# "default" and "small" are the presets as shipped: default = MH after at least 117 SH steps, at least 585
# steps with the LR decay epoch scaled with the raised epochs; small = SH throughout, at least 1000 steps,
# no LR decay. "default before (no step schedule)" is the default preset as it was before train.min_steps and
# loss.warmup_sh_steps were set (5 epochs × 8 steps on this set).
W0 = {"train.num_workers": 0}  # in-process (no Ray): the comparisons below do not depend on workers
BEFORE = {**W0, "train.min_steps": 0, "loss.warmup_sh_steps": 0}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "default before (no step schedule)": ("default", BEFORE),
    "default": ("default", W0),
    "default s1": ("default", {**W0, "train.seed": 1}),
    "default s2": ("default", {**W0, "train.seed": 2}),
    "default 2w": ("default", {}),
    "default (no stall fallback)": ("default", {**W0, "loss.stall_fallback": False}),
    "tiny": ("tiny", W0),
    "vsepp-coco": ("vsepp-coco", W0),
    "small": ("small", W0),
    "small s1": ("small", {**W0, "train.seed": 1}),
    "small s2": ("small", {**W0, "train.seed": 2}),
    "small 2w": ("small", {}),
    "small b64": ("small", {**W0, "train.batch_size": 64}),
    "small ms600": ("small", {**W0, "train.min_steps": 600}),
}


def caption_of(right_half: np.ndarray, threshold: int = INK_THRESHOLD) -> str:
    """Words ``r{row}c{col}`` (col 4–7) for the pixels of an 8×4 right half with intensity >= ``threshold``,
    row-major; ``"blank"`` when none is inked (never happens at the default threshold)."""
    rows, cols = np.nonzero(right_half >= threshold)
    words = [f"r{r}c{c + 4}" for r, c in zip(rows, cols)]
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
    parts = {"train": order[: n - val - test], "val": order[n - val - test : n - test], "test": order[n - test :]}
    return {k: np.sort(v) for k, v in parts.items()}


def build_dataset(out: str | Path, *, seed: int = 0, limit: int | None = None, sizes: dict[str, int] = SPLIT_SIZES,
                  threshold: int = INK_THRESHOLD, overwrite: bool = True) -> Path:
    """Write the digit-halves set with raydist's DatasetWriter (vocab from train, min count 1); ``limit``
    keeps the first ``limit`` digits (for smoke tests). Returns ``out``."""
    features, captions, _ = digit_halves(threshold)
    n = len(captions) if limit is None else min(limit, len(captions))
    parts = split_indices(n, seed, sizes)
    source = {"generator": "bench/real_cross_view.py", "data": "sklearn.datasets.load_digits", "seed": seed,
              "limit": limit, "ink_threshold": threshold, "image": "left half / 16 (rows 0-7, cols 0-3)",
              "caption": "right half: r{row}c{col} per pixel >= threshold, row-major"}
    with DatasetWriter(out, source=source, overwrite=overwrite) as writer:
        writer.vocab = Vocab.build((captions[i] for i in parts["train"]), min_count=1)
        for split, idx in parts.items():
            writer.add_split(split, idx, idx, features[idx], [captions[i] for i in idx])
    return Path(out)


def bag_of_words(captions: Sequence[str], vocab: Vocab) -> np.ndarray:
    """Word counts ``[N, len(vocab) - 4]`` (specials dropped; out-of-vocab words ignored)."""
    out = np.zeros((len(captions), len(vocab) - 4), dtype=np.float64)
    for row, caption in enumerate(captions):
        for tok in tokenize(caption):
            j = vocab.index.get(tok, -1)
            if j >= 4:
                out[row, j - 4] += 1
    return out


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _split_views(data_dir: Path, split: str, vocab: Vocab) -> tuple[np.ndarray, np.ndarray]:
    """(features [N, D], bag-of-words [N, V]) of a split with one caption per image."""
    image_ids, _, features, captions = split_arrays(data_dir, split)
    if len(np.unique(image_ids)) != len(image_ids):
        raise ValueError("the linear baselines assume one caption per image")
    return features.astype(np.float64), bag_of_words(captions, vocab)


def cca_baseline(data_dir: str | Path, components: int = 16, split: str = "test") -> dict[str, float]:
    """CCA (``components`` pairs) fitted on train; both test views projected, L2-normalised, VSE++ metrics."""
    from sklearn.cross_decomposition import CCA

    data_dir = Path(data_dir)
    vocab = Vocab.load(data_dir / "vocab.json")
    x_train, b_train = _split_views(data_dir, "train", vocab)
    x_test, b_test = _split_views(data_dir, split, vocab)
    keep = b_train.std(0) > 0  # a word absent from train carries nothing (and breaks scaling)
    k = min(components, x_train.shape[1], int(keep.sum()))
    cca = CCA(n_components=k, max_iter=2000).fit(x_train, b_train[:, keep])
    img, cap = cca.transform(x_test, b_test[:, keep])
    return retrieval_metrics(_unit(img), _unit(cap), np.arange(len(img)))


def least_squares_baseline(data_dir: str | Path, ridge: float = 1e-3, split: str = "test") -> dict[str, float]:
    """Ridge map ``W = argmin ‖X̃W − B̃‖² + ridge·N‖W‖²`` (X̃, B̃ centred on train means); score =
    cos(X̃_test W, B̃_test); VSE++ metrics."""
    data_dir = Path(data_dir)
    vocab = Vocab.load(data_dir / "vocab.json")
    x_train, b_train = _split_views(data_dir, "train", vocab)
    x_test, b_test = _split_views(data_dir, split, vocab)
    mx, mb = x_train.mean(0), b_train.mean(0)
    xc = x_train - mx
    gram = xc.T @ xc + ridge * len(xc) * np.eye(xc.shape[1])
    w = np.linalg.solve(gram, xc.T @ (b_train - mb))
    return retrieval_metrics(_unit((x_test - mx) @ w), _unit(b_test - mb), np.arange(len(x_test)))


def run_variant(preset: str, overrides: dict[str, Any], data_dir: Path, storage: Path) -> dict[str, Any]:
    """One ``run_training`` (console output swallowed): test metrics of the best checkpoint (by val rsum),
    wall and this process's CPU seconds (all of the work when in-process), steps, epochs, SH/MH epochs."""
    from raydist.config import load_config
    from raydist.train.trainer import run_training

    fixed = {"data.path": str(data_dir), "train.storage_path": str(storage), "train.tensorboard": False,
             "eval.folds": 1}
    cfg = load_config(preset, overrides={**overrides, **fixed})
    t0, c0 = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        outcome = run_training(cfg)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    phases = [h.get("phase", "") for h in outcome.history]
    first_mh = phases.index("MH") if "MH" in phases else len(phases)
    return {**outcome.test_metrics, "wall": wall, "cpu": cpu, "epochs": len(phases),
            "steps": outcome.history[-1]["step"] if phases else 0, "sh": phases.count("SH"),
            "mh": phases.count("MH"), "fallbacks": phases[first_mh:].count("SH")}


HEADER = (f"{'variant':30}" + "".join(f"{k.replace('_r', ' R@'):>9}" for k in KEYS)
          + f"{'wall s':>8}{'cpu s':>7}{'steps':>7}{'epochs':>7}  SH/MH epochs (fallbacks)")


def _row(name: str, m: dict[str, Any]) -> str:
    """One table line; training runs add time, steps, epochs and the loss phases."""
    line = f"{name:30}" + "".join(f"{m[k]:9.1f}" for k in KEYS)
    if "wall" in m:
        line += (f"{m['wall']:8.0f}{m['cpu']:7.0f}{m['steps']:7d}{m['epochs']:7d}"
                 f"  {m['sh']}/{m['mh']} ({m['fallbacks']})")
    return line


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/raydist-digits-halves", help="dataset folder (rebuilt)")
    parser.add_argument("--storage", default="/tmp/raydist-digits-runs", help="run folders (deleted after)")
    parser.add_argument("--seed", type=int, default=0, help="split seed")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names (see --list)")
    parser.add_argument("--baselines-only", action="store_true")
    parser.add_argument("--list", action="store_true", help="print the variants and exit")
    parser.add_argument("--json", default="", help="also write every row's metrics to this JSON file")
    args = parser.parse_args(argv)
    if args.list:
        for name, (preset, over) in VARIANTS.items():
            print(f"{name:34} --preset {preset} {' '.join(f'{k}={v}' for k, v in over.items())}")
        return
    torch.set_num_threads(1)  # in-process runs: one thread, like a Ray worker (2 threads on a shared box crawl)
    data_dir = build_dataset(args.out, seed=args.seed)
    vocab = Vocab.load(data_dir / "vocab.json")
    print(f"dataset {data_dir}: train/val/test 1100/300/397 digits, vocab {len(vocab)} ({len(vocab) - 4} words)")
    print(HEADER)
    rows = {"baseline cca16": cca_baseline(data_dir), "baseline lsq": least_squares_baseline(data_dir)}
    for name, m in rows.items():
        print(_row(name, m), flush=True)
    names = [] if args.baselines_only else [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variant(s) {unknown}; --list shows them")
    storage = Path(args.storage)
    for name in names:
        preset, over = VARIANTS[name]
        rows[name] = run_variant(preset, over, data_dir, storage / re.sub(r"\W+", "-", name))
        print(_row(name, rows[name]), flush=True)
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()  # stop Ray's log forwarding before its run folders go
    shutil.rmtree(storage, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
