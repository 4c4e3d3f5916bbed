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


def _caption_level_brute_force(img, cap, owner, texts):
    """Caption-level R@K by sorting: a hit is any image owning a caption with the same text (case and
    spacing ignored); the rank is the position of the first hit in the sorted list (scores are distinct)."""
    norm = [" ".join(t.lower().split()) for t in texts]
    out = {}
    for name, n_q, n_k in (("i2t", len(img), len(cap)), ("t2i", len(cap), len(img))):
        ranks = []
        for q in range(n_q):
            if name == "t2i":
                scores = [float(cap[q] @ img[i]) for i in range(n_k)]
                hits = {int(owner[j]) for j in range(len(cap)) if norm[j] == norm[q]}
            else:
                scores = [float(img[q] @ cap[j]) for j in range(n_k)]
                own = {norm[j] for j in range(len(cap)) if owner[j] == q}
                hits = {j for j in range(n_k) if norm[j] in own}
            order = sorted(range(n_k), key=lambda k: -scores[k])
            ranks.append(min(order.index(k) for k in hits))
        for k in (1, 5, 10):
            out[f"{name}_cap_r{k}"] = 100.0 * sum(r < k for r in ranks) / len(ranks)
    out["cap_rsum"] = sum(out[f"{d}_cap_r{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10))
    return out


def _exact_ceiling_by_enumeration(owner, texts, n_img):
    """The best exact-protocol rsum when captions of one text share one image ranking: try every ranking
    per text (tiny sets only) and keep the one with the most t2i hits at each K."""
    import itertools

    best = 300.0
    for k in (1, 5, 10):
        hits = 0
        for text in sorted(set(texts)):
            queries = [owner[j] for j in range(len(texts)) if texts[j] == text]
            hits += max(
                sum(o in order[:k] for o in queries) for order in itertools.permutations(range(n_img))
            )
        best += 100.0 * hits / len(texts)
    return best


def test_caption_level_recall_and_the_exact_ceiling_when_captions_repeat():
    from raydist.eval.metrics import format_metrics

    rng = np.random.default_rng(5)
    n_img = 6
    owner = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5])
    texts = ["a dog", "A  dog", "a dog", "red car", "a dog", "tree", "red car", "sky", "x", "y", "sky", "z"]
    img = rng.standard_normal((n_img, 8))
    cap = img[owner] + 1.5 * rng.standard_normal((len(owner), 8))
    norm = [" ".join(t.lower().split()) for t in texts]
    for j in range(len(cap)):  # one text embeds one way, as a text encoder does
        cap[j] = cap[norm.index(norm[j])]
    got = retrieval_metrics(img, cap, owner, captions=texts)
    want = _caption_level_brute_force(img, cap, owner, texts)
    for key, value in want.items():
        assert got[key] == pytest.approx(value), key
    for key, value in brute_force(img, cap, owner).items():  # the exact protocol is unchanged
        assert got[key] == pytest.approx(value), key
    assert got["rsum_ceiling"] == pytest.approx(_exact_ceiling_by_enumeration(owner, norm, n_img))
    assert got["rsum_ceiling"] < 600 and got["rsum"] <= got["rsum_ceiling"] + 1e-9
    assert got["t2i_cap_r1"] >= got["t2i_r1"] and "can reach at most" in format_metrics(got)
    unique = [f"caption {j}" for j in range(len(owner))]  # no text on two images: the VSE++ keys alone
    assert set(retrieval_metrics(img, cap, owner, captions=unique)) == set(METRIC_KEYS)
