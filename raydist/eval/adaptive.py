"""Adaptive and funnel retrieval with nested embeddings (Kusupati et al. 2022), their cost and baselines.

Owns the whole-database adaptive and funnel retrieval of two arrays (an index built on the spot, then
:func:`raydist.retrieval.search.search`), the MFLOPs/query formula (docs/algorithms.md#retrieval-cost) and
projections for non-nested models (first m dims, SVD, Gaussian JL).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import numpy as np

from raydist.retrieval.index import build_index
from raydist.retrieval.search import Cascade, search


def mflops_per_query(num_database: int, shortlist_dim: int, rerank: Iterable[tuple[int, int]] = ()) -> float:
    """``(N·D_s + Σ_i k_i·D_i) / 10⁶``: the shortlist scans N vectors at D_s, re-rank i scores k_i at D_i."""
    terms = [(num_database, shortlist_dim), *rerank]
    if any(n < 0 or d < 0 for n, d in terms):
        raise ValueError(f"counts and dims must be non-negative, got {terms}")
    return sum(n * d for n, d in terms) / 1e6


def _check_pair(db: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    db, queries = np.asarray(db), np.asarray(queries)
    if db.ndim != 2 or queries.ndim != 2 or db.shape[1] != queries.shape[1]:
        raise ValueError(f"expected db [N, D] and queries [Q, D], got {db.shape} and {queries.shape}")
    return db, queries


def _check_dim(name: str, dim: int, full: int) -> None:
    if not 1 <= dim <= full:
        raise ValueError(f"{name}={dim}: expected 1 <= {name} <= {full} (embedding dim)")


def adaptive_retrieval(
    db: np.ndarray,
    queries: np.ndarray,
    *,
    shortlist_dim: int,
    rerank_dim: int,
    shortlist: int = 200,
    k: int = 10,
    index_kind: str = "flat",
) -> tuple[np.ndarray, np.ndarray]:
    """Shortlist ``shortlist`` ids at D_s, re-rank them at D_r, keep the best k: (scores, ids) [Q, k].

    ``db`` [N, D] and ``queries`` [Q, D] are raw nested embeddings; every prefix is re-normalised.
    ``shortlist`` larger than N is cut to N. Cost: ``mflops_per_query(N, D_s, [(shortlist, D_r)])``.
    """
    return funnel_retrieval(
        db, queries, dims=[shortlist_dim, rerank_dim], shortlists=[shortlist], k=k, index_kind=index_kind
    )


def funnel_retrieval(
    db: np.ndarray,
    queries: np.ndarray,
    *,
    dims: Sequence[int],
    shortlists: Sequence[int],
    k: int = 10,
    index_kind: str = "flat",
) -> tuple[np.ndarray, np.ndarray]:
    """Funnel retrieval: a cascade of re-ranks over growing prefixes: (scores, ids) [Q, k].

    Convention: ``len(shortlists) == len(dims) − 1``. Stage 0 searches the whole db at ``dims[0]`` and
    keeps ``shortlists[0]``; stage i ≥ 1 re-ranks the current shortlist at ``dims[i]`` and keeps
    ``shortlists[i]``, the last stage keeping k. So the MRL funnel is ``dims=[16, 32, 64, 128, 2048],
    shortlists=[200, 100, 50, 25], k=10``. Shortlists must be non-increasing and ≥ k; any larger than N
    is cut to N. Cost: ``mflops_per_query(N, dims[0], zip(shortlists, dims[1:]))``.
    """
    db, queries = _check_pair(db, queries)
    n, full = db.shape
    if len(dims) < 2 or len(shortlists) != len(dims) - 1:
        raise ValueError(
            f"need len(shortlists) == len(dims) - 1 >= 1, got dims={dims}, shortlists={shortlists}"
        )
    for i, dim in enumerate(dims):
        _check_dim(f"dims[{i}]", dim, full)
    if not 1 <= k <= n:
        raise ValueError(f"k={k}: expected 1 <= k <= {n} (database size)")
    if any(a < b for a, b in itertools.pairwise(shortlists)) or shortlists[-1] < k:
        raise ValueError(f"shortlists={shortlists}: expected non-increasing sizes, all >= k={k}")
    index = build_index(db[:, : dims[0]], index_kind)
    return search({dims[0]: index}, queries, k, cascade=Cascade(tuple(dims), tuple(shortlists)), database=db)


def project_first_m(x: np.ndarray, m: int) -> np.ndarray:
    """``x[:, :m]``: the first m coordinates (the naive truncation of a non-nested embedding)."""
    x = np.asarray(x)
    _check_dim("m", m, x.shape[1])
    return x[:, :m]


def project_svd(train_x: np.ndarray, m: int) -> np.ndarray:
    """``P = V[:, :m]`` [D, m] from the SVD ``train_x = U Σ Vᵀ``; apply as ``db @ P`` and ``queries @ P``.

    Uncentred, so inner products are kept exactly on the row space: ``⟨xP, yP⟩ = ⟨x, y⟩`` when
    ``train_x`` has rank ≤ m and x, y lie in its row space.
    """
    x = np.asarray(train_x, dtype=np.result_type(train_x, np.float32))
    if not 1 <= m <= min(x.shape):
        raise ValueError(f"m={m}: expected 1 <= m <= min(rows, dim) = {min(x.shape)}")
    return np.linalg.svd(x, full_matrices=False)[2][:m].T


def project_random(d: int, m: int, seed: int = 0) -> np.ndarray:
    """Gaussian Johnson–Lindenstrauss map ``P`` [d, m], ``P_ij ~ N(0, 1/m)``, so ``E‖xP‖² = ‖x‖²``."""
    _check_dim("m", m, d)
    return (np.random.default_rng(seed).standard_normal((d, m)) / np.sqrt(m)).astype(np.float32)
