"""``bench/digits_png.py splits`` writes the digits on a seeded split (issue #51: the digits results over more
than one split): the sizes of the digit halves' split, seed 0 its split, another seed another split of the same
sizes; each PNG in its class folder, checked against scikit-learn's labels."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")
ROOT = Path(__file__).resolve().parents[1]


def _digits_png():
    spec = importlib.util.spec_from_file_location("digits_png", ROOT / "bench" / "digits_png.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _written(root: Path) -> dict[str, dict[int, int]]:
    """Per split: digit index → the class folder it was written to."""
    return {
        split: {int(p.stem): int(p.parent.name) for p in (root / split).glob("*/*.png")}
        for split in ("train", "val", "test")
    }


def test_splits_take_a_seed_and_keep_the_sizes(tmp_path):
    from sklearn.datasets import load_digits

    digits_png = _digits_png()
    labels = load_digits().target
    digits_png.splits(tmp_path / "s0", 8)
    digits_png.splits(tmp_path / "s1", 8, seed=1)
    first, second = _written(tmp_path / "s0"), _written(tmp_path / "s1")
    assert [len(first[s]) for s in first] == [len(second[s]) for s in second] == [1100, 300, 397]
    for written in (first, second):
        assert sorted(i for split in written.values() for i in split) == list(range(len(labels)))
        assert all(labels[i] == label for split in written.values() for i, label in split.items())
    # seed 0 is the split the earlier records used: a fixed permutation of numpy's seeded generator
    order = np.random.default_rng(0).permutation(len(labels))
    assert sorted(first["test"]) == sorted(order[-397:].tolist())
    assert len(set(first["test"]) & set(second["test"])) < 150  # another split (by chance about 88 shared)
