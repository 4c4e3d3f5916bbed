"""The retrieval benchmark (raydist/benchmarks/retrieval.py) times its own re-rank path; on the benchmark's
own (smoke-size) data it must rank exactly as flat search and raydist.eval.adaptive do."""

from __future__ import annotations

import numpy as np
import pytest

from raydist.benchmarks.retrieval import (
    SMOKE,
    Planted,
    TorchTopkIndex,
    cascade_search,
    embed_data,
    exact_recall,
    rerank_unit,
    threads,
    train_encoder,
    unit_prefixes,
)
from raydist.eval.adaptive import adaptive_retrieval, funnel_retrieval
from raydist.retrieval.index import build_index
from raydist.retrieval.search import Cascade, default_funnel


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    planted = Planted()
    with threads(1):
        encoder, _ = train_encoder(SMOKE, planted)
        database, queries, _ = embed_data(SMOKE, planted, encoder)
    return database, queries


def test_adaptive_at_full_dim_ranks_as_flat_search(data) -> None:
    database, queries = data
    full = database.shape[1]
    units = unit_prefixes(database, [full])
    got = cascade_search(
        build_index(database, "flat", use_gpu=False), units, queries, Cascade((full, full), (200,))
    )
    _, want = build_index(database, "flat", use_gpu=False).search(queries, 10)
    np.testing.assert_array_equal(got, want)
    assert exact_recall(got, want) == 100.0


def test_cascades_rank_as_the_library(data) -> None:
    database, queries = data
    full = database.shape[1]
    funnel = default_funnel(SMOKE.nesting, full, 200, 10)
    units = unit_prefixes(database, [full, *funnel.dims[1:]])
    for ds in SMOKE.shortlist_dims:
        index = build_index(database[:, :ds], "flat", use_gpu=False)
        got = cascade_search(index, units, queries, Cascade((ds, full), (200,)))
        _, want = adaptive_retrieval(database, queries, shortlist_dim=ds, rerank_dim=full, shortlist=200)
        np.testing.assert_array_equal(got, want)
        topk = TorchTopkIndex(database[:, :ds], chunk=7)
        np.testing.assert_array_equal(cascade_search(topk, units, queries, Cascade((ds, full), (200,))), want)
    index = build_index(database[:, : funnel.dims[0]], "flat", use_gpu=False)
    _, want = funnel_retrieval(database, queries, dims=funnel.dims, shortlists=funnel.shortlists)
    np.testing.assert_array_equal(cascade_search(index, units, queries, funnel), want)


def test_exact_recall_and_missing_candidates() -> None:
    exact = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert exact_recall(np.array([[4, 3, 9, 9], [5, 6, 7, 8]]), exact) == 75.0
    eye = np.eye(3, dtype=np.float32)
    np.testing.assert_array_equal(rerank_unit(eye, eye[:1], np.array([[1, 0, -1]]), 3), [[0, 1, -1]])
    with pytest.raises(ValueError, match="-1"):
        rerank_unit(eye, eye[:1], np.array([[0, -1, 1]]), 1)


def test_rerank_unit_matches_numpy() -> None:
    rng = np.random.default_rng(3)
    units = unit_prefixes(rng.standard_normal((300, 24)), [24])[24]
    queries = unit_prefixes(rng.standard_normal((9, 24)), [24])[24]
    candidates = np.stack([rng.choice(300, 40, replace=False) for _ in queries])
    candidates[::2, 33:] = -1  # a short IVF shortlist, padded at the end
    got = rerank_unit(units, queries, candidates, 12)
    for q, cand, row in zip(queries, candidates, got, strict=False):
        valid = cand[cand >= 0]
        want = valid[np.argsort(-(units[valid] @ q), kind="stable")][:12]
        np.testing.assert_array_equal(row, want)


def test_ivf_shortlist_cascade_matches_brute_force(data) -> None:
    database, queries = data
    dc, full, nprobe, short = 16, database.shape[1], 4, 50
    index = build_index(database[:, :dc], "ivf-prefix", ivf_lists=32, nprobe=nprobe, use_gpu=False)
    got = cascade_search(index, unit_prefixes(database, [full]), queries, Cascade((dc, full), (short,)))
    centroids = index.coarse.index.reconstruct_n(0, index.nlist)
    db, qs = unit_prefixes(database, [dc, full]), unit_prefixes(queries, [dc, full])
    for q_low, q_full, row in zip(qs[dc], qs[full], got, strict=False):
        probes = np.argsort(-(centroids @ q_low))[:nprobe]
        pool = np.concatenate([index.lists[c] for c in probes])
        shortlist = pool[np.argsort(-(db[dc][pool] @ q_low), kind="stable")][:short]
        want = shortlist[np.argsort(-(db[full][shortlist] @ q_full), kind="stable")][:10]
        np.testing.assert_array_equal(row[: len(want)], want)
        assert (row[len(want) :] == -1).all()
