"""Adaptive/funnel retrieval against float64 numpy cascades; cost arithmetic and projections by hand."""

import numpy as np
import pytest

from raydist.eval.adaptive import (
    adaptive_retrieval,
    funnel_retrieval,
    mflops_per_query,
    project_first_m,
    project_random,
    project_svd,
)
from raydist.retrieval.index import build_index


def unit_prefix(x: np.ndarray, m: int) -> np.ndarray:
    p = x[:, :m].astype(np.float64)
    return p / np.linalg.norm(p, axis=1, keepdims=True)


def cascade(db: np.ndarray, queries: np.ndarray, dims: list[int], keeps: list[int]) -> np.ndarray:
    """Reference funnel in float64: rank all of db at dims[0] keeping keeps[0], then each candidate set at
    dims[i] keeping keeps[i]. Asserts no near-tie (gap < 1e-5) where one could change the answer under
    float32 rounding: at every cut, and between consecutive ranks of the final list; the seeds pass."""
    out = []
    for q in range(len(queries)):
        cand = np.arange(len(db))
        for stage, (dim, keep) in enumerate(zip(dims, keeps, strict=False)):
            s = unit_prefix(db[cand], dim) @ unit_prefix(queries[q : q + 1], dim)[0]
            order = np.argsort(-s)
            ranked = s[order[: keep + 1]]
            gaps = np.diff(ranked) if stage == len(dims) - 1 else np.diff(ranked[-2:])
            assert len(gaps) == 0 or gaps.max() < -1e-5, "near-tie: choose another seed"
            cand = cand[order[:keep]]
        out.append(cand)
    return np.array(out)


@pytest.fixture(scope="module")
def data():
    """Raw embeddings with unequal row norms (so re-normalising each prefix matters)."""
    rng = np.random.default_rng(4)
    db = rng.standard_normal((800, 32)) * rng.uniform(0.5, 5.0, (800, 1))
    queries = rng.standard_normal((12, 32)) * rng.uniform(0.5, 5.0, (12, 1))
    return db, queries


@pytest.mark.parametrize("shortlist", [10, 50])
def test_equal_dims_is_single_shot_at_that_dim(data, shortlist):
    db, queries = data
    scores, ids = adaptive_retrieval(db, queries, shortlist_dim=8, rerank_dim=8, shortlist=shortlist, k=10)
    np.testing.assert_array_equal(ids, cascade(db, queries, [8], [10]))
    expected = np.take_along_axis(unit_prefix(queries, 8) @ unit_prefix(db, 8).T, ids, 1)
    np.testing.assert_allclose(scores, expected, atol=1e-5)


def test_full_dim_both_stages_is_flat_full_dim_search(data):
    db, queries = data
    _, ids = adaptive_retrieval(db, queries, shortlist_dim=32, rerank_dim=32, shortlist=40, k=10)
    np.testing.assert_array_equal(ids, cascade(db, queries, [32], [10]))
    np.testing.assert_array_equal(ids, build_index(db, "flat").search(queries, 10)[1])


def test_rerank_at_a_larger_dim(data):
    db, queries = data
    _, ids = adaptive_retrieval(db, queries, shortlist_dim=4, rerank_dim=32, shortlist=30, k=5)
    np.testing.assert_array_equal(ids, cascade(db, queries, [4, 32], [30, 5]))


def test_funnel_with_one_rerank_equals_adaptive(data):
    db, queries = data
    funnel = funnel_retrieval(db, queries, dims=[8, 32], shortlists=[40], k=10)
    adaptive = adaptive_retrieval(db, queries, shortlist_dim=8, rerank_dim=32, shortlist=40, k=10)
    np.testing.assert_array_equal(funnel[1], adaptive[1])
    np.testing.assert_array_equal(funnel[0], adaptive[0])


def test_funnel_cascade(data):
    db, queries = data
    _, ids = funnel_retrieval(db, queries, dims=[4, 8, 16, 32], shortlists=[100, 50, 20], k=5)
    np.testing.assert_array_equal(ids, cascade(db, queries, [4, 8, 16, 32], [100, 50, 20, 5]))


def test_shortlist_larger_than_database_is_cut(data):
    db, queries = data
    _, ids = adaptive_retrieval(db[:30], queries, shortlist_dim=4, rerank_dim=32, shortlist=200, k=5)
    np.testing.assert_array_equal(ids, cascade(db[:30], queries, [32], [5]))


def test_hnsw_shortlist_recall(data):
    db, queries = data
    _, ids = adaptive_retrieval(db, queries, shortlist_dim=32, rerank_dim=32, shortlist=50, index_kind="hnsw")
    exact = cascade(db, queries, [32], [10])
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, exact, strict=False)]) >= 0.95


@pytest.mark.parametrize(
    "dims, shortlists",
    [
        ([8], []),
        ([8, 16], [50, 20]),
        ([8, 64], [50]),
        ([0, 16], [50]),
        ([4, 8, 16], [20, 50]),
        ([8, 16], [5]),
    ],
)
def test_funnel_validation(data, dims, shortlists):
    db, queries = data
    with pytest.raises(ValueError):
        funnel_retrieval(db, queries, dims=dims, shortlists=shortlists, k=10)


def test_mflops_worked_example():
    n = 1_280_000
    assert mflops_per_query(n, 16) == pytest.approx(20.48)
    assert mflops_per_query(n, 2048) == pytest.approx(2621.44)
    assert mflops_per_query(n, 2048) / mflops_per_query(n, 16) == pytest.approx(128.0)
    assert mflops_per_query(n, 16, [(200, 2048)]) == pytest.approx(20.48 + 0.4096)  # 200·2048 = 409 600
    funnel = [(200, 32), (100, 64), (50, 128), (25, 2048)]  # 6400 + 6400 + 6400 + 51 200 = 70 400
    assert mflops_per_query(n, 16, funnel) == pytest.approx(20.5504)
    with pytest.raises(ValueError):
        mflops_per_query(-1, 16)


def test_svd_projection_keeps_inner_products_of_rank_m_data():
    rng = np.random.default_rng(5)
    basis = rng.standard_normal((6, 40))
    train, db, queries = (rng.standard_normal((n, 6)) @ basis for n in (100, 50, 7))
    p = project_svd(train, 6)
    assert p.shape == (40, 6)
    np.testing.assert_allclose((queries @ p) @ (db @ p).T, queries @ db.T, rtol=1e-10, atol=1e-9)


def test_random_projection_roughly_preserves_norms():
    """P_ij ~ N(0, 1/512): ‖xP‖²/‖x‖² ~ χ²₅₁₂/512 (sd ≈ 0.0625), so each norm ratio is within 0.2 of 1
    (> 6 sd) and the mean squared ratio over 300 vectors within 0.05 of 1."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((300, 1024)) * rng.uniform(0.1, 10.0, (300, 1))
    p = project_random(1024, 512, seed=7)
    assert p.shape == (1024, 512)
    np.testing.assert_array_equal(p, project_random(1024, 512, seed=7))
    ratio = np.linalg.norm(x @ p.astype(np.float64), axis=1) / np.linalg.norm(x, axis=1)
    assert np.abs(ratio - 1).max() < 0.2
    assert abs(np.mean(ratio**2) - 1) < 0.05


def test_project_first_m():
    x = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(project_first_m(x, 2), [[0, 1], [4, 5], [8, 9]])
    with pytest.raises(ValueError):
        project_first_m(x, 5)
