"""The one search front end (raydist.retrieval.search.search) in every mode against brute-force numpy in float64:
flat ranks the whole database at a prefix, adaptive and funnel re-rank shortlists at growing prefixes."""

from __future__ import annotations

import numpy as np
import pytest

from raydist.retrieval.index import build_index
from raydist.retrieval.search import Cascade, default_funnel, mode_cascade, search

DIMS = (8, 16, 32, 64)


def unit(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute(
    db: np.ndarray, queries: np.ndarray, dims: list[int], keeps: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Each query's rows: the whole database ranked at dims[0] keeping keeps[0], then each kept list re-ranked at
    dims[i] keeping keeps[i]; the last stage's scores and rows, best first (float64, stable order)."""
    all_scores, all_rows = [], []
    for q in range(len(queries)):
        rows = np.arange(len(db))
        for dim, keep in zip(dims, keeps, strict=True):
            s = unit(db[rows, :dim]) @ unit(queries[q : q + 1, :dim])[0]
            order = np.argsort(-s, kind="stable")[:keep]
            rows, scores = rows[order], s[order]
        all_scores.append(scores)
        all_rows.append(rows)
    return np.array(all_scores), np.array(all_rows)


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray, dict[int, object]]:
    rng = np.random.default_rng(3)
    db = rng.standard_normal((300, 64)).astype(np.float32)
    queries = rng.standard_normal((12, 64)).astype(np.float32)
    indexes = {d: build_index(db[:, :d], "flat", use_gpu=False) for d in DIMS}
    return db, queries, indexes


def assert_same(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> None:
    np.testing.assert_allclose(got[0], want[0], atol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("dim", DIMS)
def test_flat_ranks_the_whole_database_at_the_prefix(data, dim):
    db, queries, indexes = data
    assert_same(search(indexes, queries, 10, dim=dim), brute(db, queries, [dim], [10]))


def test_flat_defaults_to_the_largest_indexed_dim(data):
    db, queries, indexes = data
    assert_same(search(indexes, queries, 5), brute(db, queries, [64], [5]))


@pytest.mark.parametrize("shortlist", [20, 300, 1000])
def test_adaptive_shortlists_at_the_smallest_dim_and_reranks_at_dim(data, shortlist):
    db, queries, indexes = data
    got = search(indexes, queries, 10, dim=32, mode="adaptive", shortlist=shortlist, database=db)
    assert_same(got, brute(db, queries, [8, 32], [min(shortlist, len(db)), 10]))


def test_funnel_reranks_through_the_dims_below(data):
    db, queries, indexes = data
    got = search(indexes, queries, 10, dim=64, mode="funnel", shortlist=120, database=db)
    assert_same(got, brute(db, queries, [8, 16, 32, 64], [120, 60, 30, 10]))


def test_an_explicit_cascade(data):
    db, queries, indexes = data
    cascade = Cascade((16, 64, 32), (100, 40))
    got = search(indexes, queries, 7, cascade=cascade, database=db)
    assert_same(got, brute(db, queries, [16, 64, 32], [100, 40, 7]))


def test_a_shortlist_of_every_row_is_flat_search(data):
    db, queries, indexes = data
    got = search(indexes, queries, 10, dim=64, mode="adaptive", shortlist=len(db), database=db)
    np.testing.assert_array_equal(got[1], search(indexes, queries, 10, dim=64)[1])


def test_mode_cascades():
    assert mode_cascade("flat", DIMS, 64, 10) is None
    assert mode_cascade("adaptive", DIMS, 32, 10, 200) == Cascade((8, 32), (200,))
    assert mode_cascade("adaptive", DIMS, 32, 300, 200) == Cascade((8, 32), (300,))
    assert mode_cascade("funnel", DIMS, 64, 10, 200) == default_funnel([8, 16, 32], 64, 200, 10)
    assert mode_cascade("funnel", DIMS, 64, 10, 200) == Cascade((8, 16, 32, 64), (200, 100, 50))


def test_refusals(data):
    db, queries, indexes = data
    with pytest.raises(ValueError, match="mode='nearest'"):
        search(indexes, queries, 10, mode="nearest")
    with pytest.raises(ValueError, match="dim=12"):
        search(indexes, queries, 10, dim=12)
    with pytest.raises(ValueError, match="below dim=8"):
        search(indexes, queries, 10, dim=8, mode="adaptive", database=db)
    with pytest.raises(ValueError, match="give database"):
        search(indexes, queries, 10, dim=64, mode="funnel")
