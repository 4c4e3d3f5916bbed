"""Retrieval metrics against a brute-force ranking (argsort per query) on random embeddings."""

import math

import numpy as np
import pytest
import torch

from raydist.eval import METRIC_KEYS, retrieval_metrics


def brute_force(img: np.ndarray, cap: np.ndarray, owner: np.ndarray) -> dict[str, float]:
    n_img, n_cap = len(img), len(cap)
    i2t = []
    for i in range(n_img):
        scores = [float(img[i] @ cap[j]) for j in range(n_cap)]
        order = sorted(range(n_cap), key=lambda j: -scores[j])  # stable: ties keep index order
        i2t.append(min(order.index(j) for j in range(n_cap) if owner[j] == i))
    t2i = []
    for j in range(n_cap):
        scores = [float(cap[j] @ img[i]) for i in range(n_img)]
        order = sorted(range(n_img), key=lambda i: -scores[i])
        t2i.append(order.index(owner[j]))
    out = {}
    for name, ranks in (("i2t", np.array(i2t)), ("t2i", np.array(t2i))):
        for k in (1, 5, 10):
            out[f"{name}_r{k}"] = 100.0 * sum(r < k for r in ranks) / len(ranks)
        out[f"{name}_medr"] = math.floor(np.median(ranks)) + 1
        out[f"{name}_meanr"] = ranks.mean() + 1
    out["rsum"] = sum(out[f"{d}_r{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
    return out


def random_set(rng, n_img, per=5, dim=8, signal=1.0):
    img = rng.standard_normal((n_img, dim))
    owner = np.repeat(np.arange(n_img), per)
    cap = signal * img[owner] + rng.standard_normal((n_img * per, dim))
    return img, cap, owner


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    img, cap, owner = random_set(rng, 40)
    got = retrieval_metrics(img, cap, owner)
    want = brute_force(img, cap, owner)
    assert set(got) == set(METRIC_KEYS)
    for k in METRIC_KEYS:
        assert got[k] == pytest.approx(want[k], abs=1e-9), k


def test_five_folds_average_of_consecutive_folds():
    rng = np.random.default_rng(5)
    img, cap, owner = random_set(rng, 50, signal=0.5)
    got = retrieval_metrics(torch.tensor(img), torch.tensor(cap), owner, folds=5)
    folds = []
    for f in range(5):
        sel = (owner >= 10 * f) & (owner < 10 * (f + 1))
        folds.append(brute_force(img[10 * f : 10 * (f + 1)], cap[sel], owner[sel] - 10 * f))
    for k in METRIC_KEYS:
        assert got[k] == pytest.approx(np.mean([m[k] for m in folds]), abs=1e-9), k
    assert got["rsum"] != pytest.approx(retrieval_metrics(img, cap, owner)["rsum"])


def test_captions_in_any_order_and_uneven_counts():
    rng = np.random.default_rng(7)
    img = rng.standard_normal((12, 6))
    owner = rng.permutation(np.concatenate([np.arange(12), rng.integers(0, 12, 20)]))
    cap = img[owner] * 0.7 + rng.standard_normal((len(owner), 6))
    got, want = retrieval_metrics(img, cap, owner), brute_force(img, cap, owner)
    for k in METRIC_KEYS:
        assert got[k] == pytest.approx(want[k], abs=1e-9), k


def test_image_without_caption_is_an_error():
    img = np.eye(3)
    with pytest.raises(ValueError, match="images without captions"):
        retrieval_metrics(img, np.eye(3)[:2], np.array([0, 1]))
