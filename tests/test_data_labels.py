"""Labelled datasets: the synthetic generator (validity, determinism, duplicates, learnability vs overlap),
label-noise injection (flip rate, other-class flips, clean labels, untouched val/test) and the npz converter."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from raydist.converters.npz import convert_npz
from raydist.data import RaydistDataError, feature_matrix, load_manifest, read_split, validate_dataset
from raydist.data.labels_io import corrupt_labels
from raydist.data.shards import DatasetWriter
from raydist.data.standardize import STANDARDIZATION_NAME, load_standardization, standardize_features
from raydist.data.synthetic_labels import make_synthetic_labels

SPLITS = ("train", "val", "test")
SMALL = {"classes": 4, "train_per_class": 12, "val_per_class": 3, "test_per_class": 5, "dim": 8}


def _columns(path, split):
    t = read_split(path, split)
    return {
        name: feature_matrix(t.column(name)) if name == "image" else t.column(name).to_numpy()
        for name in t.column_names
    }


def _shard_hashes(path):
    return [
        hashlib.sha256((path / s.file).read_bytes()).hexdigest()
        for split in load_manifest(path).splits.values()
        for s in split.shards
    ]


def _nearest_class_mean_accuracy(path):
    train, test = _columns(path, "train"), _columns(path, "test")
    classes = load_manifest(path).num_classes
    means = np.stack([train["image"][train["label"] == c].mean(0) for c in range(classes)])
    pred = ((test["image"][:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    return float((pred == test["label"]).mean())


# --- synthetic generator --------------------------------------------------------------------------------


def test_synthetic_labels_schema_ids_and_validity(tmp_path):
    out = make_synthetic_labels(tmp_path / "ds", **SMALL)
    assert validate_dataset(out).ok
    manifest = load_manifest(out)
    assert (manifest.task, manifest.num_classes, manifest.feature_dim) == ("labels", 4, 8)
    assert [manifest.splits[s].rows for s in SPLITS] == [48, 12, 20]
    ids = []
    for split, per_class in zip(SPLITS, (12, 3, 5), strict=False):
        cols = _columns(out, split)
        assert set(cols) == {"image_id", "sample_id", "image", "label", "clean_label"}
        assert np.array_equal(cols["image_id"], cols["sample_id"])
        assert np.array_equal(cols["label"], cols["clean_label"])
        assert np.bincount(cols["label"], minlength=4).tolist() == [per_class] * 4
        ids.extend(cols["sample_id"])
    assert sorted(ids) == list(range(80))
    train_labels = _columns(out, "train")["label"]
    assert np.count_nonzero(np.diff(train_labels)) > 20  # shuffled, not class-sorted


def test_synthetic_labels_deterministic_per_seed(tmp_path):
    a = make_synthetic_labels(tmp_path / "a", **SMALL, seed=5)
    b = make_synthetic_labels(tmp_path / "b", **SMALL, seed=5)
    c = make_synthetic_labels(tmp_path / "c", **SMALL, seed=6)
    assert _shard_hashes(a) == _shard_hashes(b)
    assert (a / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()
    assert set(_shard_hashes(a)).isdisjoint(_shard_hashes(c))


def test_synthetic_labels_duplicates_are_identical_rows(tmp_path):
    out = make_synthetic_labels(tmp_path / "ds", **SMALL, duplicates=3, rows_per_shard=16)
    assert validate_dataset(out).ok
    train = _columns(out, "train")
    assert len(train["sample_id"]) == 48 * 3 == len(set(train["sample_id"]))
    groups = {}
    for row, label in zip(train["image"], train["label"], strict=False):
        groups.setdefault(row.tobytes(), []).append(label)
    assert len(groups) == 48
    assert all(len(labels) == 3 and len(set(labels)) == 1 for labels in groups.values())
    first_rows = [np.flatnonzero((train["image"] == train["image"][i]).all(1)) for i in range(10)]
    assert all(r.max() - r.min() > 2 for r in first_rows)  # copies are scattered, not adjacent
    assert len(_columns(out, "test")["sample_id"]) == 20  # only train is duplicated


def test_synthetic_labels_learnable_and_harder_with_overlap(tmp_path):
    sizes = {"classes": 10, "train_per_class": 200, "val_per_class": 2, "test_per_class": 200, "dim": 32}
    acc = {
        ov: _nearest_class_mean_accuracy(make_synthetic_labels(tmp_path / f"o{ov}", overlap=ov, **sizes))
        for ov in (0.02, 0.3, 0.7, 1.0)
    }
    assert acc[0.02] > 0.7  # chance is 0.1 (seeds 0-2 give 0.79-0.84)
    assert acc[0.02] > acc[0.3] + 0.1 > acc[0.7] + 0.2
    assert abs(acc[1.0] - 0.1) < 0.05  # 2000 test rows: 0.05 is > 7 standard errors of chance


@pytest.mark.parametrize("overlap", [0.1, 0.5, 0.9])
def test_synthetic_labels_overlap_is_the_pairwise_bayes_error(tmp_path, overlap):
    """Two classes with overlapping coefficient ``overlap``: the Bayes accuracy is 1 − overlap/2, so no
    classifier beats it, and nearest class mean (near-optimal here) comes within 0.05. 4000 test rows:
    one binomial standard error ≤ 0.008, tolerance above the bound 0.025."""
    out = make_synthetic_labels(
        tmp_path / "ds",
        classes=2,
        train_per_class=2000,
        val_per_class=1,
        test_per_class=2000,
        dim=32,
        overlap=overlap,
        seed=2,
    )
    acc = _nearest_class_mean_accuracy(out)
    assert 1 - overlap / 2 - 0.05 < acc < 1 - overlap / 2 + 0.025


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"classes": 1}, "classes"),
        ({"train_per_class": 0}, "train_per_class"),
        ({"test_per_class": 0}, "test"),
        ({"duplicates": 0}, "duplicates"),
        ({"dim": 0}, "dim"),
        ({"overlap": 1.5}, "overlap"),
        ({"overlap": -0.1}, "overlap"),
        ({"overlap": float("nan")}, "overlap"),
    ],
)
def test_synthetic_labels_refuses_bad_arguments(tmp_path, args, message):
    with pytest.raises(RaydistDataError, match=message):
        make_synthetic_labels(tmp_path / "ds", **{**SMALL, **args})


def test_synthetic_labels_refuses_existing_folder_without_overwrite(tmp_path):
    out = make_synthetic_labels(tmp_path / "ds", **SMALL)
    with pytest.raises(RaydistDataError, match="already exists"):
        make_synthetic_labels(out, **SMALL, seed=1)
    make_synthetic_labels(out, **SMALL, seed=1, overwrite=True)
    assert load_manifest(out).source["seed"] == 1


# --- corrupt_labels ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """5 classes, 10,000 train rows, over several shards."""
    return make_synthetic_labels(
        tmp_path_factory.mktemp("labels") / "src",
        classes=5,
        train_per_class=2000,
        val_per_class=20,
        test_per_class=40,
        dim=4,
        rows_per_shard=3000,
    )


def test_corrupt_labels_flip_rate_and_flip_targets(labelled, tmp_path):
    p = 0.3
    out = corrupt_labels(labelled, tmp_path / "noisy", p=p, seed=1)
    assert validate_dataset(out).ok
    train, source = _columns(out, "train"), _columns(labelled, "train")
    n = len(train["label"])
    changed = train["label"] != source["label"]
    # flip probability p to another class: the changed share is p (flips to the same class would give
    # p·(K−1)/K = 0.24); tolerance 4 binomial standard errors ≈ 0.018
    assert abs(changed.mean() - p) < 4 * math.sqrt(p * (1 - p) / n)
    shift = (train["label"][changed] - source["label"][changed]) % 5
    shares = np.bincount(shift, minlength=5) / changed.sum()
    assert shares[0] == 0
    assert np.all(np.abs(shares[1:] - 0.25) < 4 * math.sqrt(0.25 * 0.75 / changed.sum()))  # uniform other
    assert np.array_equal(train["clean_label"], source["label"])
    for name in ("image_id", "sample_id", "image"):
        assert np.array_equal(train[name], source[name])
    notes = load_manifest(out).source
    assert (notes["p"], notes["seed"], notes["flipped_train_rows"]) == (p, 1, int(changed.sum()))


def test_corrupt_labels_leaves_val_and_test_untouched(labelled, tmp_path):
    out = corrupt_labels(labelled, tmp_path / "noisy", p=0.5, seed=2)
    for split in ("val", "test"):
        new, old = _columns(out, split), _columns(labelled, split)
        for name in ("image_id", "sample_id", "image", "label", "clean_label"):
            assert np.array_equal(new[name], old[name])


def test_corrupt_labels_deterministic_and_keeps_original_clean_labels(labelled, tmp_path):
    a = corrupt_labels(labelled, tmp_path / "a", p=0.2, seed=7)
    b = corrupt_labels(labelled, tmp_path / "b", p=0.2, seed=7)
    c = corrupt_labels(labelled, tmp_path / "c", p=0.2, seed=8)
    assert _shard_hashes(a) == _shard_hashes(b)
    assert not np.array_equal(_columns(a, "train")["label"], _columns(c, "train")["label"])
    twice = corrupt_labels(a, tmp_path / "twice", p=0.2, seed=9)  # noise on noise
    assert np.array_equal(_columns(twice, "train")["clean_label"], _columns(labelled, "train")["label"])
    assert load_manifest(twice).source["parent_source"]["p"] == 0.2
    assert [s.rows for s in load_manifest(twice).splits["train"].shards] == [3000, 3000, 3000, 1000]


@pytest.mark.parametrize("p", [-0.1, 1.0, float("nan")])
def test_corrupt_labels_refuses_bad_p(labelled, tmp_path, p):
    with pytest.raises(RaydistDataError, match="p must"):
        corrupt_labels(labelled, tmp_path / "noisy", p=p, seed=0)


# --- convert_npz ------------------------------------------------------------------------------------------


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_convert_npz_round_trip_with_split_names_and_codes(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 5)), rng.integers(0, 3, 30)
    y[:3] = [0, 1, 2]
    names = np.array(["train"] * 20 + ["val"] * 4 + ["TEST"] * 6)
    for tag, split in (
        ("names", names),
        ("codes", np.array([0] * 20 + [1] * 4 + [2] * 6)),
        ("dev", np.where(names == "val", "dev", names)),
    ):
        out = convert_npz(_npz(tmp_path / f"{tag}.npz", X=x, y=y, split=split), tmp_path / tag)
        assert validate_dataset(out).ok
        assert load_manifest(out).num_classes == 3 and load_manifest(out).source["label_map"] is None
        for name, rows in zip(SPLITS, (range(20), range(20, 24), range(24, 30)), strict=False):
            cols = _columns(out, name)
            assert cols["sample_id"].tolist() == list(rows) == cols["image_id"].tolist()
            assert np.array_equal(cols["image"], x[list(rows)].astype(np.float32))
            assert np.array_equal(cols["label"], y[list(rows)])


def test_convert_npz_stratified_split_and_label_remap(tmp_path):
    rng = np.random.default_rng(1)
    y = np.repeat([3, 7, 10], 100)
    x = rng.normal(size=(300, 4)).astype(np.float32)
    src = _npz(tmp_path / "data.npz", X=x, y=y.astype(np.float64))  # whole-number floats are accepted
    out = convert_npz(src, tmp_path / "ds", val_fraction=0.1, test_fraction=0.2, seed=3)
    assert validate_dataset(out).ok
    manifest = load_manifest(out)
    assert manifest.num_classes == 3
    assert manifest.source["label_map"] == {"3": 0, "7": 1, "10": 2}
    seen = []
    for split, per_class in zip(SPLITS, (70, 10, 20), strict=False):
        cols = _columns(out, split)
        assert np.bincount(cols["label"]).tolist() == [per_class] * 3
        assert np.array_equal(cols["image"], x[cols["sample_id"]])
        assert np.array_equal(cols["label"], np.searchsorted([3, 7, 10], y[cols["sample_id"]]))
        seen.extend(cols["sample_id"])
    assert sorted(seen) == list(range(300))
    again = convert_npz(src, tmp_path / "again", seed=3)
    assert _shard_hashes(out) == _shard_hashes(again)
    other = convert_npz(src, tmp_path / "other", seed=4)
    assert not np.array_equal(_columns(out, "test")["sample_id"], _columns(other, "test")["sample_id"])


def test_convert_npz_errors_name_file_and_field(tmp_path):
    x, y = np.ones((10, 3)), np.arange(10) % 2
    bad_x = x.copy()
    bad_x[5, 1] = np.nan
    cases = {
        "no_x": ({"y": y}, ["'X'", "missing"]),
        "no_y": ({"X": x}, ["'y'", "missing"]),
        "shape": ({"X": x, "y": y[:9]}, ["'y'", "(9,)", "10 rows"]),
        "nan": ({"X": bad_x, "y": y}, ["'X'", "row 5", "non-finite"]),
        "float_labels": ({"X": x, "y": np.where(np.arange(10) == 2, 1.5, 0.0)}, ["'y'", "row 2", "1.5"]),
        "empty_label": ({"X": x, "y": np.array(list("abab ababa"))}, ["'y'", "row 4", "empty class label"]),
        "split_value": (
            {"X": x, "y": y, "split": np.array(["train"] * 7 + ["holdout"] + ["test"] * 2)},
            ["'split'", "row 7", "holdout"],
        ),
        "empty_split": (
            {"X": x, "y": y, "split": np.array(["train"] * 8 + ["test"] * 2)},
            ["'val'", "no rows"],
        ),
    }
    for name, (arrays, fragments) in cases.items():
        src = _npz(tmp_path / f"{name}.npz", **arrays)
        with pytest.raises(RaydistDataError) as info:
            convert_npz(src, tmp_path / f"out_{name}")
        message = str(info.value)
        assert str(src) in message and all(f in message for f in fragments), (name, message)
        assert not (tmp_path / f"out_{name}").exists()
    (tmp_path / "junk.npz").write_text(json.dumps({"not": "npz"}))
    with pytest.raises(RaydistDataError, match="junk.npz"):
        convert_npz(tmp_path / "junk.npz", tmp_path / "out_junk")
    with pytest.raises(RaydistDataError, match="fraction"):
        convert_npz(tmp_path / "junk.npz", tmp_path / "out_junk", val_fraction=0.5, test_fraction=0.5)


def _shifted_splits(seed=0):
    """Features of very different scales; val and test rows drawn from shifted distributions, so their own
    statistics differ from train's."""
    rng = np.random.default_rng(seed)
    scale, offset = np.array([0.01, 1.0, 50.0, 2000.0]), np.array([1.0, -3.0, 10.0, 5e4])
    x = rng.normal(size=(60, 4)) * scale + offset
    x[40:] = x[40:] * 1.5 + 2 * scale
    split = np.array(["train"] * 40 + ["val"] * 8 + ["test"] * 12)
    return x, np.arange(60) % 3, split


def test_convert_npz_standardize_uses_train_statistics_for_every_split(tmp_path, capsys):
    x, y, split = _shifted_splits()
    out = convert_npz(_npz(tmp_path / "d.npz", X=x, y=y, split=split), tmp_path / "ds", standardize=True)
    assert capsys.readouterr().err == ""  # no constant feature, no scale warning once standardised
    assert validate_dataset(out).ok
    assert load_manifest(out).standardization == STANDARDIZATION_NAME
    train = x[split == "train"]
    mu, sd = train.mean(axis=0), train.std(axis=0)
    stats = load_standardization(out)
    np.testing.assert_allclose(stats.mean, mu, rtol=1e-13)
    np.testing.assert_allclose(stats.std, sd, rtol=1e-13)
    for name in SPLITS:
        cols = _columns(out, name)
        rows = x[cols["sample_id"]]
        np.testing.assert_allclose(cols["image"], (rows - mu) / sd, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(standardize_features(rows, out), cols["image"], rtol=0, atol=0)
        if name != "train":
            own = (rows - rows.mean(axis=0)) / rows.std(axis=0)
            assert np.abs(cols["image"] - own).max() > 0.5  # not the split's own statistics
    noisy = corrupt_labels(out, tmp_path / "noisy", p=0.2, seed=0)
    assert load_manifest(noisy).standardization == STANDARDIZATION_NAME
    assert np.array_equal(load_standardization(noisy).mean, stats.mean)


def test_convert_npz_standardize_says_which_features_are_constant(tmp_path, capsys):
    x, y, split = _shifted_splits(seed=1)
    x[:, 2] = 4.0
    x[45, 2] = 6.5  # constant on train only
    out = convert_npz(_npz(tmp_path / "d.npz", X=x, y=y, split=split), tmp_path / "ds", standardize=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raydist: warning:") and "zero variance" in err[0]
    assert "constant" in err[0] and ": 2;" in err[0] and "std is taken as 1" in err[0]
    stats = load_standardization(out)
    assert stats.zero_variance == (2,) and stats.std[2] == 1.0
    val = _columns(out, "val")
    assert np.allclose(val["image"][:, 2], x[val["sample_id"], 2] - 4.0)


def test_convert_npz_warns_about_mixed_scales_only_without_standardize(tmp_path, capsys):
    x, y, split = _shifted_splits(seed=2)
    train_std = x[split == "train"].std(axis=0)
    assert train_std.max() / train_std.min() > 100
    convert_npz(_npz(tmp_path / "mixed.npz", X=x, y=y, split=split), tmp_path / "mixed")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raydist: warning:") and "--standardize" in err[0]
    assert "mixed.npz" in err[0] and "'X'" in err[0]
    assert load_manifest(tmp_path / "mixed").standardization is None
    assert load_standardization(tmp_path / "mixed") is None
    same = np.random.default_rng(3).normal(size=(60, 4)) * np.array([0.5, 1.0, 3.0, 20.0])
    convert_npz(_npz(tmp_path / "scaled.npz", X=same, y=y, split=split), tmp_path / "scaled")
    assert capsys.readouterr().err == ""


def test_convert_npz_string_labels_remap_in_sorted_order(tmp_path):
    rng = np.random.default_rng(4)
    names = np.array(["wren", "Owl", "crow", "ibis"])
    y = names[rng.integers(0, 4, 200)]
    x = rng.normal(size=(200, 3)).astype(np.float32)
    for tag, labels in (("str", y), ("bytes", np.char.encode(y, "utf-8"))):
        out = convert_npz(_npz(tmp_path / f"{tag}.npz", X=x, y=labels), tmp_path / tag, seed=1)
        assert validate_dataset(out).ok
        manifest = load_manifest(out)
        expected_names = sorted(set(y.tolist()))  # code-point order: upper case first
        assert manifest.class_names == expected_names == ["Owl", "crow", "ibis", "wren"]
        assert manifest.num_classes == 4
        assert manifest.source["label_map"] == {name: k for k, name in enumerate(expected_names)}
        seen = 0
        for split in SPLITS:
            cols = _columns(out, split)
            assert cols["label"].dtype == np.int64
            assert cols["label"].tolist() == [expected_names.index(v) for v in y[cols["sample_id"]]]
            assert np.array_equal(cols["image"], x[cols["sample_id"]])
            seen += len(cols["label"])
        assert seen == 200
    assert _shard_hashes(tmp_path / "str") == _shard_hashes(tmp_path / "bytes")
    noisy = corrupt_labels(tmp_path / "str", tmp_path / "noisy", p=0.1, seed=0)
    assert load_manifest(noisy).class_names == expected_names
    plain = convert_npz(_npz(tmp_path / "ints.npz", X=x, y=np.arange(200) % 4), tmp_path / "ints")
    assert load_manifest(plain).class_names is None and "class_names" not in json.loads(
        (plain / "manifest.json").read_text()
    )


def test_standardizing_wine_helps_nearest_neighbour_retrieval(tmp_path):
    from sklearn.datasets import load_wine

    x, y = load_wine(return_X_y=True)
    src = _npz(tmp_path / "wine.npz", X=x, y=y)

    def one_nn_accuracy(path):
        train, test = _columns(path, "train"), _columns(path, "test")
        d = (
            (test["image"][:, None, :].astype(np.float64) - train["image"][None].astype(np.float64)) ** 2
        ).sum(-1)
        return float((train["label"][d.argmin(axis=1)] == test["label"]).mean())

    raw = one_nn_accuracy(convert_npz(src, tmp_path / "raw", seed=0))
    scaled = one_nn_accuracy(convert_npz(src, tmp_path / "scaled", seed=0, standardize=True))
    assert scaled > raw + 0.1, (raw, scaled)


def _labels_dataset(out: Path, labels_per_split: dict[str, list[int]], num_classes: int) -> Path:
    with DatasetWriter(out, task="labels", num_classes=num_classes) as writer:
        first = 0
        for split, labels in labels_per_split.items():
            ids = np.arange(first, first + len(labels))
            feats = np.random.default_rng(first).normal(size=(len(ids), 4)).astype(np.float32)
            writer.add_split(split, ids, ids, feats, labels=np.array(labels))
            first += len(labels)
    return out


def test_a_split_missing_a_class_the_others_share_is_warned_with_counts(tmp_path):
    from raydist.config import load_config
    from raydist.data.labels_io import missing_class_notes, split_class_counts
    from raydist.tasks import DataInfo, build_task

    shared = {"train": [0] * 5 + [1] * 4 + [2] * 3 + [3] * 2, "val": [0, 1, 1, 3], "test": [0, 1, 2, 3, 3]}
    data = _labels_dataset(tmp_path / "shared", shared, 4)
    counts = split_class_counts(data)
    for split, labels in shared.items():  # against a count by hand
        assert counts[split].tolist() == [labels.count(c) for c in range(4)]
    notes = missing_class_notes(counts)
    assert len(notes) == 1 and "split 'val' has no rows of 1 of the 4 classes" in notes[0]
    assert "class 2: train 3, test 1" in notes[0] and "val metrics leave those classes out" in notes[0]
    task = build_task(load_config("tiny", overrides={"data.path": str(data)}), DataInfo.from_dataset(data))
    assert task.data_notes() == notes
    # train lacking a class that val and test have: never trained on
    untrained = missing_class_notes(
        {"train": np.array([4, 0]), "val": np.array([1, 2]), "test": np.array([1, 1])}
    )
    assert len(untrained) == 1 and "'train'" in untrained[0] and "never trained on" in untrained[0]
    # disjoint classes per split (the CUB/SOP protocol) are by design: no note
    disjoint = {"train": [0, 0, 1, 1], "val": [2, 2], "test": [3, 3, 3]}
    assert missing_class_notes(split_class_counts(_labels_dataset(tmp_path / "disjoint", disjoint, 4))) == []
