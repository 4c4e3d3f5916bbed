"""Labelled-set metrics: P@k and mAP@k on a hand-computed example, Recall@K and 1-NN against a brute-force
loop, NMI against hand-computed values and its invariances, k-means NMI on planted clusters."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from raydist.eval.label_metrics import (
    label_metrics,
    leave_one_out_neighbours,
    map_at_k,
    nmi,
    normalized_mutual_information,
    one_nn_accuracy,
    precision_at_k,
    recall_at_k,
)

RETRIEVED = np.array([[1, 0, 1, 1], [2, 2, 0, 1]])
QUERIES = np.array([1, 2])


def test_precision_and_map_hand_example():
    # query 0: rel = 1 0 1 1 → P@4 = 3/4, AP@4 = (1/4)(1 + 2/3 + 3/4); P@2 = 1/2, AP@2 = (1/2)(1)
    # query 1: rel = 1 1 0 0 → P@4 = 1/2, AP@4 = (1/4)(1 + 1);           P@2 = 1,   AP@2 = (1/2)(1 + 1)
    assert precision_at_k(RETRIEVED, QUERIES, 4) == pytest.approx(100 * (3 / 4 + 1 / 2) / 2)
    assert map_at_k(RETRIEVED, QUERIES, 4) == pytest.approx(100 * ((1 + 2 / 3 + 3 / 4) / 4 + 2 / 4) / 2)
    assert precision_at_k(RETRIEVED, QUERIES, 2) == pytest.approx(75.0)
    assert map_at_k(RETRIEVED, QUERIES, 2) == pytest.approx(100 * (1 / 2 + 1) / 2)
    assert map_at_k(RETRIEVED, QUERIES, 1) == precision_at_k(RETRIEVED, QUERIES, 1) == 100.0
    with pytest.raises(ValueError):
        precision_at_k(RETRIEVED, QUERIES, 5)
    with pytest.raises(ValueError):
        map_at_k(RETRIEVED, QUERIES[:1], 2)


def _brute_force(emb, labels, k):
    """Python loop: cosine similarity to every other row, sorted; recall@k hit and 1-NN correctness."""
    hits, nn_ok = [], []
    for q in range(len(emb)):
        scored = []
        for j in range(len(emb)):
            if j != q:
                cos = float(emb[q] @ emb[j]) / (np.linalg.norm(emb[q]) * np.linalg.norm(emb[j]))
                scored.append((cos, j))
        scored.sort(reverse=True)
        top = [labels[j] for _, j in scored[:k]]
        hits.append(labels[q] in top)
        nn_ok.append(top[0] == labels[q])
    return hits, nn_ok


def test_recall_and_one_nn_match_brute_force():
    rng = np.random.default_rng(5)
    emb = rng.normal(size=(70, 6)) * rng.uniform(0.5, 3.0, size=(70, 1))  # unnormalised rows
    labels = rng.integers(0, 5, 70)
    recalls = recall_at_k(emb, labels, ks=(1, 2, 4, 8))
    for k in (1, 2, 4, 8):
        hits, _ = _brute_force(emb, labels, k)
        assert recalls[f"r{k}"] == pytest.approx(100 * np.mean(hits))
    _, nn_ok = _brute_force(emb, labels, 1)
    assert one_nn_accuracy(torch.as_tensor(emb), torch.as_tensor(labels)) == pytest.approx(
        100 * np.mean(nn_ok)
    )
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    order = [[j for j in np.argsort(-(unit @ unit[q])) if j != q][:5] for q in range(70)]
    assert leave_one_out_neighbours(emb, 5, chunk=16).tolist() == order  # several chunks


def test_query_never_retrieves_itself_but_does_retrieve_its_duplicate():
    emb = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.1, 1.0]])
    assert leave_one_out_neighbours(emb, 1)[:, 0].tolist() == [1, 0, 3, 2]
    assert one_nn_accuracy(emb, [0, 1, 2, 2]) == 50.0  # rows 0 and 1 are identical but differently labelled
    with pytest.raises(ValueError):
        leave_one_out_neighbours(emb, 4)


def test_nmi_hand_example():
    # U = {0,0,1,1}, V = {0,0,0,1}: H(U) = ln 2, H(V) = −(¾ ln ¾ + ¼ ln ¼),
    # I = ½ ln(½ / (½·¾)) + ¼ ln(¼ / (½·¾)) + ¼ ln(¼ / (½·¼))
    h_u = math.log(2)
    h_v = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    mi = 0.5 * math.log(4 / 3) + 0.25 * math.log(2 / 3) + 0.25 * math.log(2)
    expected = 100 * mi / ((h_u + h_v) / 2)
    assert normalized_mutual_information([0, 0, 1, 1], [0, 0, 0, 1]) == pytest.approx(expected)
    assert expected == pytest.approx(34.3711, abs=1e-3)


def test_nmi_invariances_and_extremes():
    rng = np.random.default_rng(1)
    truth = rng.integers(0, 6, 3000)
    relabelled = np.array([5, 3, 0, 1, 4, 2])[truth] + 100  # a permutation and shift of cluster names
    assert normalized_mutual_information(truth, relabelled) == pytest.approx(100.0)
    noisy = np.where(rng.random(3000) < 0.3, rng.integers(0, 6, 3000), truth)
    assert normalized_mutual_information(truth, noisy) == pytest.approx(
        normalized_mutual_information(relabelled, np.array([2, 0, 1, 5, 3, 4])[noisy])
    )
    assert normalized_mutual_information(truth, noisy) == pytest.approx(
        normalized_mutual_information(noisy, truth)
    )
    independent = rng.integers(0, 6, 3000)
    assert normalized_mutual_information(truth, independent) < 1.0
    assert normalized_mutual_information(truth, np.zeros(3000)) == 0.0


def test_kmeans_nmi_on_planted_clusters_and_lazy_faiss():
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 8, 800)
    centres = np.eye(16)[:8] * 5.0
    emb = centres[labels] + rng.normal(size=(800, 16)) * 0.1
    assert nmi(emb, labels) == pytest.approx(100.0)
    assert nmi(emb, labels, seed=3) == pytest.approx(100.0)
    assert nmi(rng.normal(size=(800, 16)), labels) < 5.0
    code = "import sys, raydist.eval.label_metrics; assert 'faiss' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_nmi_on_few_points_per_class_prints_nothing(capfd):
    """faiss's C++ warns on stderr about fewer than 39 points per centroid (here with its defaults); NMI's
    k-means on 5 points per class prints nothing."""
    import faiss

    rng = np.random.default_rng(4)
    labels = np.repeat(np.arange(8), 5)
    emb = np.eye(16)[labels] * 5.0 + rng.normal(size=(40, 16)) * 0.1
    faiss.Kmeans(16, 8, niter=2).train(emb.astype(np.float32))
    assert "WARNING clustering 40 points to 8 centroids" in capfd.readouterr().err
    assert nmi(emb, labels) == pytest.approx(100.0)
    assert capfd.readouterr() == ("", "")


def test_label_metrics_keys_and_consistency():
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 4, 200)
    emb = np.eye(8)[labels] + rng.normal(size=(200, 8)) * 0.6
    out = label_metrics(emb, labels, k=5)
    assert sorted(out) == sorted(["r1", "r2", "r4", "r8", "p5", "map5", "nmi", "nn1"])
    assert out["nn1"] == out["r1"] == pytest.approx(one_nn_accuracy(emb, labels))
    assert {k: out[k] for k in ("r1", "r2", "r4", "r8")} == pytest.approx(recall_at_k(emb, labels))
    assert out["r1"] <= out["r2"] <= out["r4"] <= out["r8"]
    retrieved = labels[leave_one_out_neighbours(emb, 5)]
    assert out["p5"] == pytest.approx(precision_at_k(retrieved, labels, 5))
    assert out["nmi"] == pytest.approx(nmi(emb, labels))
    assert 0.0 <= out["map5"] <= out["p5"] <= 100.0
