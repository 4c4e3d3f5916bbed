"""The digit halves (raydist/experiments/digit_halves.py, ``--data digit-halves``) and the real-cross-view
benchmark's linear baselines (raydist/benchmarks/real_cross_view.py): a subset is a valid raydist dataset,
the named source builds the full split, the least-squares baseline equals scikit-learn's ridge regression and
both baselines beat chance (needs scikit-learn, the experiments extra; skipped without it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

from raydist.benchmarks.real_cross_view import cca_baseline, least_squares_baseline, split_views
from raydist.config import ConfigError
from raydist.data import Vocab, load_manifest, split_arrays, tokenize, validate_dataset
from raydist.data.shape import dataset_shape
from raydist.eval.metrics import retrieval_metrics
from raydist.experiments.datasets import experiment_dataset
from raydist.experiments.digit_halves import caption_of, write_digit_halves
from raydist.presets import preset_for_data


def _chance_rsum(n: int) -> float:
    """Expected rsum of random scores with one caption per image: 2 · Σ_K 100·K/n over K = 1, 5, 10."""
    return 2 * sum(100.0 * min(k, n) / n for k in (1, 5, 10))


@pytest.fixture(scope="module")
def subset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 600 digits: 300 train / 100 val / 200 test."""
    out = tmp_path_factory.mktemp("digits") / "halves"
    return write_digit_halves(out, limit=600, sizes={"val": 100, "test": 200})


def test_caption_rule() -> None:
    right = np.zeros((8, 4))
    right[1, 0], right[2, 3], right[5, 1] = 8, 16, 7  # 7 is below the ink threshold
    assert caption_of(right) == "r1c4 r2c7"
    assert caption_of(np.zeros((8, 4))) == "blank"


def test_subset_is_a_valid_dataset(subset: Path) -> None:
    validate_dataset(subset).raise_if_problems()
    manifest = load_manifest(subset)
    assert manifest.task == "pairs" and manifest.feature_dim == 32
    assert {s: manifest.splits[s].rows for s in ("train", "val", "test")} == {
        "train": 300,
        "val": 100,
        "test": 200,
    }
    vocab = Vocab.load(subset / "vocab.json")
    ids = {s: set(split_arrays(subset, s)[0].tolist()) for s in ("train", "val", "test")}
    assert not (ids["train"] & ids["val"] or ids["train"] & ids["test"] or ids["val"] & ids["test"])
    image_ids, sample_ids, features, captions = split_arrays(subset, "test")
    assert np.array_equal(image_ids, sample_ids)  # one caption per image
    assert features.min() >= 0 and features.max() <= 1
    unknown = [w for c in captions for w in c.split() if w not in vocab.index]
    assert len(unknown) < 0.01 * sum(len(c.split()) for c in captions)  # min count 1: almost no <unk>


def test_the_named_source_builds_the_full_split_for_pairs_runs_only(tmp_path: Path) -> None:
    data_dir = experiment_dataset("pairs", "digit-halves", tmp_path, quick=True)
    manifest = load_manifest(data_dir)
    assert {s: manifest.splits[s].rows for s in ("train", "val", "test")} == {
        "train": 1100,
        "val": 300,
        "test": 397,
    }
    assert experiment_dataset("pairs", "digit-halves", tmp_path, quick=False) == data_dir  # built once
    with pytest.raises(
        ConfigError, match="--data digit-halves: a 'pairs' dataset; this experiment needs a 'labels'"
    ):
        experiment_dataset("labels", "digit-halves", tmp_path, quick=True)


def test_least_squares_baseline_is_sklearn_ridge(subset: Path) -> None:
    from sklearn.linear_model import Ridge

    vocab = Vocab.load(subset / "vocab.json")
    (x_train, b_train), (x_test, b_test) = (split_views(subset, s, vocab) for s in ("train", "test"))
    ridge = Ridge(alpha=1e-3 * len(x_train)).fit(x_train, b_train)
    centred = b_train.mean(0)

    def unit(x):
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    want = retrieval_metrics(
        unit(ridge.predict(x_test) - centred), unit(b_test - centred), np.arange(len(x_test))
    )
    got = least_squares_baseline(subset, ridge=1e-3)
    assert got == pytest.approx(want)


def test_linear_baselines_beat_chance(subset: Path) -> None:
    chance = _chance_rsum(200)  # 16.0
    cca = cca_baseline(subset, components=16)
    lsq = least_squares_baseline(subset)
    assert cca["rsum"] > 3 * chance, cca
    assert lsq["rsum"] > 2 * chance, lsq
    assert cca["t2i_r10"] > 3 * 100 * 10 / 200


def test_digit_halves_get_the_small_preset(subset: Path) -> None:
    """`raydist train --data` with no --preset picks `small` here: one caption per digit, many shared."""
    _, _, _, captions = split_arrays(subset, "train")
    _, counts = np.unique([" ".join(tokenize(c)) for c in captions], return_counts=True)
    shape = dataset_shape(subset)
    assert shape.shared_caption_images == counts[counts > 1].sum() > 0  # one caption per digit
    assert (shape.train_images, shape.captions_per_image) == (len(captions), 1.0)
    assert preset_for_data(shape).name == "small"
