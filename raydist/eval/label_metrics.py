"""Metrics for class-labelled embeddings (docs/algorithms.md#labelled-metrics): Recall@K, P@k, mAP@k, NMI,
1-NN accuracy.

All are percentages (×100), computed on the labels given (pass the clean labels). Retrieval is
leave-one-out within the set by inner product of L2-normalised rows: a query never retrieves itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from raydist.retrieval.index import QUIET_MIN_POINTS_PER_CENTROID

NMI_KMEANS_ITERS = 20


def _normalized(emb: np.ndarray | torch.Tensor) -> torch.Tensor:
    x = torch.as_tensor(emb).detach().cpu().float()
    if x.ndim != 2:
        raise ValueError(f"embeddings must be 2-D [N, D], got shape {tuple(x.shape)}")
    return x / torch.linalg.vector_norm(x, dim=1, keepdim=True).clamp_min(1e-12)


def _labels(labels: np.ndarray | torch.Tensor | Sequence[int], n: int | None = None) -> np.ndarray:
    out = torch.as_tensor(labels).cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if out.ndim != 1 or (n is not None and len(out) != n):
        raise ValueError(f"labels must be 1-D with one label per row ({n}), got shape {out.shape}")
    return out


def leave_one_out_neighbours(emb: np.ndarray | torch.Tensor, k: int, *, chunk: int = 1024) -> np.ndarray:
    """Indices ``[N, k]`` of each row's k highest inner products among the other rows of L2-normalised
    ``emb``, best first; the query's own row is excluded by index (an identical duplicate is retrievable)."""
    x = _normalized(emb)
    n = x.shape[0]
    if not 1 <= k <= n - 1:
        raise ValueError(f"k={k} neighbours need 1 <= k <= N-1 = {n - 1}")
    out = torch.empty(n, k, dtype=torch.long)
    for s in range(0, n, chunk):
        scores = x[s : s + chunk] @ x.T
        rows = torch.arange(scores.shape[0])
        scores[rows, rows + s] = -torch.inf
        out[s : s + chunk] = scores.topk(k, dim=1).indices
    return out.numpy()


def _relevance(retrieved_labels: np.ndarray, query_labels: np.ndarray, k: int) -> np.ndarray:
    """``rel[q, r] = retrieved_labels[q, r] == query_labels[q]`` for r < k."""
    retrieved, query = np.asarray(retrieved_labels), _labels(query_labels)
    if retrieved.ndim != 2 or retrieved.shape[0] != len(query):
        raise ValueError(f"retrieved_labels must be [Q, >=k] with Q = {len(query)}, got {retrieved.shape}")
    if not 1 <= k <= retrieved.shape[1]:
        raise ValueError(f"k={k} needs 1 <= k <= {retrieved.shape[1]} retrieved labels per query")
    return retrieved[:, :k] == query[:, None]


def precision_at_k(retrieved_labels: np.ndarray, query_labels: np.ndarray, k: int) -> float:
    """P@k = mean over queries of (1/k)·Σ_{r=1..k} rel_r, in %; ``retrieved_labels`` is [Q, ≥k], best first."""
    return 100.0 * float(_relevance(retrieved_labels, query_labels, k).mean())


def map_at_k(retrieved_labels: np.ndarray, query_labels: np.ndarray, k: int) -> float:
    """mAP@k = mean over queries of (1/k)·Σ_{r=1..k} rel_r·P@r, in % (P@r = (1/r)·Σ_{i≤r} rel_i);
    the normalisation is 1/k whatever the number of relevant items."""
    rel = _relevance(retrieved_labels, query_labels, k).astype(np.float64)
    precision = np.cumsum(rel, axis=1) / np.arange(1, k + 1)
    return 100.0 * float(((rel * precision).sum(axis=1) / k).mean())


def _recalls(retrieved: np.ndarray, labels: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be a non-empty list of positive cut-offs, got {ks}")
    hit = np.logical_or.accumulate(retrieved == labels[:, None], axis=1)
    return {f"r{k}": 100.0 * float(hit[:, k - 1].mean()) for k in ks}


def recall_at_k(
    emb: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor, ks: Sequence[int] = (1, 2, 4, 8)
) -> dict[str, float]:
    """``{"r{k}": %}``: share of queries with at least one same-label item among their k nearest other rows."""
    labels = _labels(labels, len(emb))
    return _recalls(labels[leave_one_out_neighbours(emb, max(ks, default=1))], labels, ks)


def one_nn_accuracy(emb: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor) -> float:
    """1-NN accuracy, in %: share of queries whose nearest other row has the query's label."""
    labels = _labels(labels, len(emb))
    return 100.0 * float((labels[leave_one_out_neighbours(emb, 1)[:, 0]] == labels).mean())


def _entropy(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def normalized_mutual_information(labels_a: np.ndarray, labels_b: np.ndarray) -> float:
    """NMI(U, V) = I(U; V) / ((H(U) + H(V)) / 2), in % (arithmetic-mean normalisation, natural log;
    100 when both partitions are a single block)."""
    a, b = _labels(labels_a), _labels(labels_b, len(labels_a))
    _, ia = np.unique(a, return_inverse=True)
    _, ib = np.unique(b, return_inverse=True)
    joint = np.zeros((ia.max() + 1, ib.max() + 1))
    np.add.at(joint, (ia, ib), 1.0)
    h_a, h_b = _entropy(joint.sum(axis=1)), _entropy(joint.sum(axis=0))
    if h_a == 0.0 and h_b == 0.0:
        return 100.0
    mutual = h_a + h_b - _entropy(joint.ravel())
    return 100.0 * max(mutual, 0.0) / ((h_a + h_b) / 2)


def _kmeans_pp_init(x: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding: each next centre drawn with probability ∝ squared distance to the nearest chosen."""
    centres = [x[rng.integers(len(x))]]
    dist = ((x - centres[0]) ** 2).sum(axis=1)
    for _ in range(1, k):
        total = dist.sum()
        pick = rng.choice(len(x), p=dist / total) if total > 0 else rng.integers(len(x))
        centres.append(x[pick])
        dist = np.minimum(dist, ((x - x[pick]) ** 2).sum(axis=1))
    return np.stack(centres)


def nmi(
    emb: np.ndarray | torch.Tensor,
    labels: np.ndarray | torch.Tensor,
    num_clusters: int | None = None,
    seed: int = 0,
) -> float:
    """NMI (in %) between ``labels`` and a k-means clustering of the L2-normalised rows into
    ``num_clusters`` (default: the number of distinct labels) clusters: k-means++ seeding (``seed``), then
    ``faiss.Kmeans`` with ``NMI_KMEANS_ITERS`` Lloyd iterations; see :func:`normalized_mutual_information`."""
    import faiss

    x = _normalized(emb).numpy()
    labels = _labels(labels, len(x))
    k = len(np.unique(labels)) if num_clusters is None else num_clusters
    if not 1 <= k <= len(x):
        raise ValueError(f"num_clusters={k} must lie in [1, N={len(x)}]")
    init = _kmeans_pp_init(x, k, np.random.default_rng(seed))
    kmeans = faiss.Kmeans(
        x.shape[1],
        k,
        niter=NMI_KMEANS_ITERS,
        seed=seed,
        verbose=False,
        min_points_per_centroid=QUIET_MIN_POINTS_PER_CENTROID,
        max_points_per_centroid=max(256, len(x)),
    )
    kmeans.train(x, init_centroids=init)
    _, assignment = kmeans.index.search(x, 1)
    return normalized_mutual_information(labels, assignment[:, 0])


def label_metrics(
    emb: np.ndarray | torch.Tensor,
    labels: np.ndarray | torch.Tensor,
    *,
    ks: Sequence[int] = (1, 2, 4, 8),
    k: int = 10,
) -> dict[str, float]:
    """All labelled-set metrics in % from one leave-one-out neighbour search: ``r{K}`` for K in ``ks``,
    ``p{k}``, ``map{k}``, ``nmi``, ``nn1``."""
    labels = _labels(labels, len(emb))
    retrieved = labels[leave_one_out_neighbours(emb, max([*ks, k]))]
    return {
        **_recalls(retrieved, labels, ks),
        f"p{k}": precision_at_k(retrieved, labels, k),
        f"map{k}": map_at_k(retrieved, labels, k),
        "nmi": nmi(emb, labels),
        "nn1": 100.0 * float((retrieved[:, 0] == labels).mean()),
    }
