"""raydist.data.standardize: train statistics against numpy, the saved file's round trip and checks, the
transform for new vectors against the formula, and the scale spread behind convert's warning."""

from __future__ import annotations

import json

import numpy as np
import pytest

from raydist.data import RaydistDataError
from raydist.data.standardize import (
    STANDARDIZATION_NAME,
    feature_scale_spread,
    fit_standardization,
    load_standardization,
    standardize_features,
    write_standardization,
)


def _mixed_scales(rows: int = 50, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(rows, 4)) * np.array([1e-3, 1.0, 30.0, 1e3]) + np.array([5.0, -2.0, 0.0, 1e4])


def test_fit_matches_numpy_float64_and_constant_features_keep_std_one():
    x = _mixed_scales().astype(np.float32)
    x[:, 1] = 7.25  # constant column
    stats = fit_standardization(x)
    x64 = x.astype(np.float64)
    assert stats.mean.dtype == stats.std.dtype == np.float64
    np.testing.assert_allclose(stats.mean, np.mean(x64, axis=0), rtol=1e-13, atol=0)
    expected_std = np.std(x64, axis=0)
    expected_std[1] = 1.0
    np.testing.assert_allclose(stats.std, expected_std, rtol=1e-13, atol=0)
    assert stats.zero_variance == (1,) and stats.train_rows == 50 and stats.feature_dim == 4
    z = stats.apply(x64)
    np.testing.assert_allclose(z[:, [0, 2, 3]].mean(0), 0, atol=1e-9)
    np.testing.assert_allclose(z[:, [0, 2, 3]].std(0), 1, rtol=1e-9)
    assert np.array_equal(z[:, 1], x64[:, 1] - 7.25)


def test_saved_statistics_round_trip_and_apply_equals_the_formula(tmp_path):
    train, queries = _mixed_scales(seed=1), _mixed_scales(rows=7, seed=2)
    stats = fit_standardization(train)
    path = write_standardization(tmp_path, stats)
    assert path.name == STANDARDIZATION_NAME
    loaded = load_standardization(path)
    assert np.array_equal(loaded.mean, stats.mean) and np.array_equal(loaded.std, stats.std)
    assert (loaded.zero_variance, loaded.train_rows) == (stats.zero_variance, stats.train_rows)
    mu, sd = train.mean(0), train.std(0)
    out = standardize_features(queries, path)
    assert out.dtype == np.float32 and out.shape == queries.shape
    np.testing.assert_allclose(out, (queries - mu) / sd, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(standardize_features(queries[0], loaded), (queries[0] - mu) / sd, rtol=1e-6)
    with pytest.raises(RaydistDataError, match=r"\[N, 4\]"):
        standardize_features(queries[:, :3], loaded)


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        ({"std": [1.0, 0.0]}, ["'std'", "entry 1", "> 0"]),
        ({"mean": [0.0]}, ["'mean'", "'std'", "one per feature"]),
        ({"mean": "oops"}, ["'mean'", "list of numbers"]),
        ({"zero_variance": [5]}, ["'zero_variance'"]),
    ],
)
def test_a_bad_statistics_file_names_file_and_field(tmp_path, change, fragments):
    raw = {"mean": [0.0, 1.0], "std": [1.0, 2.0], "zero_variance": [], "train_rows": 3, **change}
    path = tmp_path / STANDARDIZATION_NAME
    path.write_text(json.dumps(raw))
    with pytest.raises(RaydistDataError) as info:
        load_standardization(path)
    assert str(path) in str(info.value) and all(f in str(info.value) for f in fragments)
    with pytest.raises(RaydistDataError, match="neither a dataset folder"):
        load_standardization(tmp_path / "missing.json")


def test_scale_spread_is_max_over_min_std_of_the_varying_features():
    x = _mixed_scales(seed=3)
    stds = x.std(axis=0)
    assert feature_scale_spread(x) == pytest.approx(stds.max() / stds.min(), rel=1e-12)
    x[:, 0] = 3.0  # a constant feature is ignored, not a zero in the denominator
    assert feature_scale_spread(x) == pytest.approx(stds[1:].max() / stds[1:].min(), rel=1e-12)
    assert feature_scale_spread(np.ones((5, 3))) == 1.0


def test_validate_and_manifest_refuse_a_broken_standardization_or_class_names(tmp_path):
    from raydist.converters.npz import convert_npz
    from raydist.data import load_manifest, validate_dataset

    rng = np.random.default_rng(5)
    src = tmp_path / "d.npz"
    np.savez(src, X=_mixed_scales(rows=60, seed=5), y=np.array(["a", "b", "c"])[rng.integers(0, 3, 60)])
    out = convert_npz(src, tmp_path / "ds", standardize=True)
    assert validate_dataset(out).ok
    stats_file = out / STANDARDIZATION_NAME
    raw = json.loads(stats_file.read_text())
    stats_file.write_text(json.dumps({**raw, "mean": raw["mean"][:3], "std": raw["std"][:3]}))
    problems = [str(p) for p in validate_dataset(out).problems]
    assert len(problems) == 1 and STANDARDIZATION_NAME in problems[0] and "feature_dim is 4" in problems[0]
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "class_names": ["a", "b"]}))
    with pytest.raises(RaydistDataError, match=r"'class_names': expected 3 distinct names"):
        load_manifest(out)
