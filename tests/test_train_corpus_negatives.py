"""Corpus-mined hard negatives (raydist/train/corpus_negatives.py): the FAISS mining equals a brute-force numpy
ranking, on random rows (with and without a query's own row in the database) and on a checkpoint's embedded train
split, and every mined row respects the rank range, the margin and the key mask."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raydist.config import load_config
from raydist.retrieval.trained import load_trained
from raydist.tasks import DataInfo, build_task
from raydist.train.corpus_negatives import mine_negatives, mine_set_negatives
from raydist.train.local import LocalRuntime
from raydist.train.loop import run_loop
from raydist.train.plan import step_plan


def brute_force(queries, database, query_keys, database_keys, *, k, ranks, margin, exclude_self=False):
    """Every score by numpy, each query's candidates sorted by score (stable), the rank window, the margin."""
    scores = queries.astype(np.float32) @ database.astype(np.float32).T
    lo, hi = ranks
    out = np.full((len(queries), k), -1)
    for q in range(len(queries)):
        same = database_keys == query_keys[q]
        if exclude_self:
            same[q] = False
            positive = scores[q][same].max() if same.any() else -np.inf
            same[q] = True
        else:
            positive = scores[q][same].max() if same.any() else -np.inf
        order = [j for j in np.argsort(-scores[q], kind="stable") if database_keys[j] != query_keys[q]]
        kept = [j for j in order[lo - 1 : hi] if scores[q, j] < positive * (1 - margin)][:k]
        out[q, : len(kept)] = kept
    return out


def check_mined(mined, queries, database, query_keys, database_keys, *, ranks, margin, positive) -> None:
    """Range, margin and mask of every mined row."""
    scores = queries @ database.T
    for q, rows in enumerate(mined):
        rows = rows[rows >= 0]
        assert (database_keys[rows] != query_keys[q]).all()  # never the query's image or label
        candidates = np.argsort(-scores[q], kind="stable")
        candidates = candidates[database_keys[candidates] != query_keys[q]]
        rank = {int(j): r + 1 for r, j in enumerate(candidates)}
        assert all(ranks[0] <= rank[int(j)] <= ranks[1] for j in rows)
        assert (scores[q, rows] < positive[q] * (1 - margin) + 1e-6).all()


@pytest.mark.parametrize("exclude_self", [False, True])
def test_mining_equals_a_brute_force_ranking(exclude_self) -> None:
    g = np.random.default_rng(0)
    database = g.normal(size=(300, 16)).astype(np.float32)
    database /= np.linalg.norm(database, axis=1, keepdims=True)
    database_keys = g.integers(0, 40, 300)
    if exclude_self:  # labels: the queries are the database rows
        queries, query_keys = database, database_keys
    else:  # pairs: a caption near its image
        query_keys = g.integers(0, 40, 200)
        first = np.array(
            [
                np.flatnonzero(database_keys == key)[0] if (database_keys == key).any() else 0
                for key in query_keys
            ]
        )
        queries = database[first] + 0.5 * g.normal(size=(200, 16)).astype(np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    options = {"k": 4, "ranks": (3, 30), "margin": 0.05, "exclude_self": exclude_self}
    got = mine_negatives(queries, database, query_keys, database_keys, **options)
    want = brute_force(queries, database, query_keys, database_keys, **options)
    np.testing.assert_array_equal(got, want)
    assert (got >= 0).sum() > 0.25 * got.size  # many queries get their K
    with pytest.raises(ValueError, match=r"rank range \[0, 5\]"):
        mine_negatives(queries, database, query_keys, database_keys, k=1, ranks=(0, 5), margin=0)


def test_a_checkpoints_train_split_mined_as_brute_force_ranks_it(tiny_dataset, tmp_path) -> None:
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(tiny_dataset),
            "train.num_workers": 0,
            "train.epochs": 1,
            "train.epoch_steps": 5,
        },
    )
    task = build_task(cfg, DataInfo.from_dataset(tiny_dataset))
    plan = step_plan(cfg, task.info.task)
    runtime = LocalRuntime(cfg, task, plan, tmp_path)
    run_loop(cfg, task, runtime, plan)
    checkpoint = sorted(Path(tmp_path).glob("checkpoint_*"))[-1]
    rset = load_trained(checkpoint).embed("train")
    options = {"k": 5, "ranks": (2, 40), "margin": 0.1}
    got = mine_set_negatives(rset, **options)
    args = (rset.queries, rset.database, rset.query_keys, rset.database_keys)
    np.testing.assert_array_equal(got, brute_force(*args, **options))
    positive = np.array(
        [rset.database[key] @ query for query, key in zip(rset.queries, rset.query_keys, strict=True)]
    )
    check_mined(got, *args, ranks=options["ranks"], margin=options["margin"], positive=positive)
    assert got.shape == (len(rset.queries), 5) and (got >= 0).sum() > 100  # 5 steps in: few positives rank high
