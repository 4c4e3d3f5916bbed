"""Smoke test of bench/real_cross_view.py: a subset of the digit-halves set is a valid raydist dataset and
its linear baselines beat chance (needs scikit-learn, the experiments extra; skipped without it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

pytest.importorskip("sklearn")

from raydist.data import Vocab, load_manifest, split_arrays, validate_dataset

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "real_cross_view.py"


def _bench() -> ModuleType:
    """bench/ is not a package: load the script as a module."""
    spec = importlib.util.spec_from_file_location("real_cross_view", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def _chance_rsum(n: int) -> float:
    """Expected rsum of random scores with one caption per image: 2 · Σ_K 100·K/n over K = 1, 5, 10."""
    return 2 * sum(100.0 * min(k, n) / n for k in (1, 5, 10))


@pytest.fixture(scope="module")
def subset(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, Path]:
    """The first 600 digits: 300 train / 100 val / 200 test."""
    bench = _bench()
    out = tmp_path_factory.mktemp("digits") / "halves"
    return bench, bench.build_dataset(out, limit=600, sizes={"val": 100, "test": 200})


def test_caption_rule() -> None:
    bench = _bench()
    right = np.zeros((8, 4))
    right[1, 0], right[2, 3], right[5, 1] = 8, 16, 7  # 7 is below the ink threshold
    assert bench.caption_of(right) == "r1c4 r2c7"
    assert bench.caption_of(np.zeros((8, 4))) == "blank"


def test_subset_is_a_valid_dataset(subset: tuple[ModuleType, Path]) -> None:
    _, data_dir = subset
    validate_dataset(data_dir).raise_if_problems()
    manifest = load_manifest(data_dir)
    assert manifest.feature_dim == 32
    assert {s: manifest.splits[s].rows for s in ("train", "val", "test")} == {"train": 300, "val": 100, "test": 200}
    vocab = Vocab.load(data_dir / "vocab.json")
    ids = {s: set(split_arrays(data_dir, s)[0].tolist()) for s in ("train", "val", "test")}
    assert not (ids["train"] & ids["val"] or ids["train"] & ids["test"] or ids["val"] & ids["test"])
    image_ids, sample_ids, features, captions = split_arrays(data_dir, "test")
    assert np.array_equal(image_ids, sample_ids)  # one caption per image
    assert features.min() >= 0 and features.max() <= 1
    unknown = [w for c in captions for w in c.split() if w not in vocab.index]
    assert len(unknown) < 0.01 * sum(len(c.split()) for c in captions)  # min count 1: almost no <unk>


def test_linear_baselines_beat_chance(subset: tuple[ModuleType, Path]) -> None:
    bench, data_dir = subset
    chance = _chance_rsum(200)  # 16.0
    cca = bench.cca_baseline(data_dir, components=16)
    lsq = bench.least_squares_baseline(data_dir)
    assert cca["rsum"] > 3 * chance, cca
    assert lsq["rsum"] > 2 * chance, lsq
    assert cca["t2i_r10"] > 3 * 100 * 10 / 200
