"""Synthetic generator: determinism, planted structure, learnability, default cached dataset."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np

from raydist.data import (
    Vocab,
    default_dataset_dir,
    ensure_default_dataset,
    load_manifest,
    make_synthetic,
    split_arrays,
    validate_dataset,
)
from raydist.data.synthetic import ATTRIBUTES, DEFAULTS, split_sizes

SMALL = {"images": 400, "val_images": 8, "test_images": 200, "dim": 64}


def _shard_hashes(path):
    return [
        hashlib.sha256((path / s.file).read_bytes()).hexdigest()
        for split in load_manifest(path).splits.values()
        for s in split.shards
    ]


def test_same_seed_same_bytes_different_seed_different(tmp_path):
    args = {"images": 40, "val_images": 8, "test_images": 8, "dim": 8, "rows_per_shard": 64}
    a, b = make_synthetic(tmp_path / "a", **args), make_synthetic(tmp_path / "b", **args)
    c = make_synthetic(tmp_path / "c", seed=1, **args)
    assert _shard_hashes(a) == _shard_hashes(b)
    assert (a / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()
    assert set(_shard_hashes(a)).isdisjoint(_shard_hashes(c))
    assert validate_dataset(a).ok


def test_shape_ids_and_near_duplicate_structure(tmp_path):
    out = make_synthetic(
        tmp_path / "ds", images=40, val_images=8, test_images=16, dim=8, captions_per_image=3
    )
    manifest = load_manifest(out)
    assert [manifest.splits[s].images for s in ("train", "val", "test")] == [40, 8, 16]
    ids = {s: split_arrays(out, s)[0] for s in ("train", "val", "test")}
    assert all(np.all(np.bincount(v - v.min())[np.unique(v - v.min())] == 3) for v in ids.values())
    assert not set(ids["train"]) & set(ids["test"])
    # captions of each test image name attributes; recover each image's object/colour from its captions
    _, _, feats, caps = split_arrays(out, "test")
    words = [set(" ".join(caps[i : i + 3]).split()) for i in range(0, len(caps), 3)]
    objects = [next(o for o, syn in ATTRIBUTES["object"].items() if words_i & set(syn)) for words_i in words]
    colours = [next(c for c, syn in ATTRIBUTES["colour"].items() if words_i & set(syn)) for words_i in words]
    # planted near-duplicates: many test images share object and colour with another test image
    shared = sum(
        1
        for i, j in itertools.combinations(range(16), 2)
        if objects[i] == objects[j] and colours[i] == colours[j]
    )
    assert shared >= 4
    assert np.isfinite(feats).all() and (feats >= 0).all()  # ReLU features


def test_val_and_test_scale_with_the_train_images_unless_given(tmp_path):
    assert split_sizes(DEFAULTS["images"], None, None) == (DEFAULTS["val_images"], DEFAULTS["test_images"])
    assert split_sizes(600, None, None) == (100, 200)
    assert split_sizes(5, None, None) == (1, 1)
    assert split_sizes(600, 7, None) == (7, 200) and split_sizes(600, None, 0) == (100, 0)
    out = make_synthetic(tmp_path / "ds", images=60, captions_per_image=1, dim=4)
    manifest = load_manifest(out)
    assert [manifest.splits[s].images for s in ("train", "val", "test")] == [60, 10, 20]
    assert (manifest.source["val_images"], manifest.source["test_images"]) == (10, 20)


def _bag_of_words(captions, vocab):
    out = np.zeros((len(captions), len(vocab)))
    for row, caption in enumerate(captions):
        for token in vocab.encode(caption, 64)[1:-1]:
            out[row, token] += 1
    return out


def _linear_recall_at_1(train, test, vocab, shuffle_train=False):
    """Ridge regression image features → caption bag-of-words on train; text→image R@1 on test by
    brute-force ranks of cosine similarity."""
    _, _, x, caps = train
    if shuffle_train:
        x = x[np.random.default_rng(0).permutation(len(x))]
    a = np.c_[x, np.ones(len(x))]
    w = np.linalg.solve(a.T @ a + np.eye(a.shape[1]), a.T @ _bag_of_words(caps, vocab))
    test_ids, _, test_x, test_caps = test
    images, first = np.unique(test_ids, return_index=True)
    pred = np.c_[test_x[first], np.ones(len(first))] @ w
    pred /= np.linalg.norm(pred, axis=1, keepdims=True)
    text = _bag_of_words(test_caps, vocab)
    text /= np.linalg.norm(text, axis=1, keepdims=True)
    scores = text @ pred.T  # captions x images
    truth = np.searchsorted(images, test_ids)
    rank = (scores > scores[np.arange(len(truth)), truth][:, None]).sum(axis=1)
    return float((rank == 0).mean()), 1.0 / len(images)


def test_planted_structure_is_linearly_learnable(tmp_path):
    out = make_synthetic(tmp_path / "ds", **SMALL)
    vocab = Vocab.load(out / "vocab.json")
    train, test = split_arrays(out, "train"), split_arrays(out, "test")
    r1, chance = _linear_recall_at_1(train, test, vocab)
    assert r1 > 40 * chance, (r1, chance)  # measured 0.34 vs chance 0.005
    r1_control, _ = _linear_recall_at_1(train, test, vocab, shuffle_train=True)
    assert r1_control < 5 * chance, r1_control


def test_default_dataset_is_cached_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYDIST_CACHE", str(tmp_path / "cache"))
    path = default_dataset_dir()
    assert path.parent == tmp_path / "cache" and path.name.startswith("synthetic-v1-")
    assert ensure_default_dataset() == path
    manifest = load_manifest(path)
    assert manifest.feature_dim == DEFAULTS["dim"] == 128
    assert manifest.splits["train"].images == DEFAULTS["images"]
    assert manifest.splits["train"].rows == DEFAULTS["images"] * DEFAULTS["captions_per_image"]
    stamp = (path / "manifest.json").stat().st_mtime_ns
    assert ensure_default_dataset() == path
    assert (path / "manifest.json").stat().st_mtime_ns == stamp  # reused, not regenerated
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no leftover staging folders
