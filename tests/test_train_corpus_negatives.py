"""Corpus-mined hard negatives (raydist/train/corpus_negatives.py): the FAISS mining equals a brute-force numpy
ranking, on random rows (with and without a query's own row in the database) and on a checkpoint's embedded train
split, and every mined row respects the rank range, the margin and the key mask."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from raydist.checkpoint import load_checkpoint
from raydist.config import Config, apply_overrides, load_config, loss_problems
from raydist.retrieval.trained import load_trained
from raydist.tasks import DataInfo, build_task
from raydist.train.corpus_negatives import CorpusNegativesHook, mine_negatives, mine_set_negatives
from raydist.train.hooks import Hook
from raydist.train.local import LocalRuntime
from raydist.train.loop import run_loop
from raydist.train.plan import step_plan
from raydist.train.wiring import build_hooks


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


def in_process(data_dir, run_dir, **overrides):
    """A one-epoch in-process run of the tiny preset on ``data_dir``: config, task, step plan, runtime."""
    base = {"data.path": str(data_dir), "train.num_workers": 0, "train.epochs": 1}
    cfg = load_config("tiny", overrides={**base, **overrides})
    task = build_task(cfg, DataInfo.from_dataset(data_dir))
    plan = step_plan(cfg, task.info.task)
    return cfg, task, plan, LocalRuntime(cfg, task, plan, run_dir)


def test_a_checkpoints_train_split_mined_as_brute_force_ranks_it(tiny_dataset, tmp_path) -> None:
    cfg, task, plan, runtime = in_process(tiny_dataset, tmp_path, **{"train.epoch_steps": 5})
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
    assert (
        got.shape == (len(rset.queries), 5) and (got >= 0).sum() > 100
    )  # 5 steps in: few positives rank high


class Steps(Hook):
    """Each step's statistics."""

    def __init__(self) -> None:
        self.stats: list[dict[str, float]] = []

    def after_step(self, ctx, loss: float, stats: dict[str, float]) -> None:
        self.stats.append(dict(stats))


def test_an_in_process_run_mines_every_few_steps_and_scores_the_mined_rows(
    tiny_dataset, tmp_path, capsys
) -> None:
    """``loss.mined_negatives=4`` every 3 steps: the hook's table is the brute-force ranking of the train rows as
    the model embedded them (images against captions, by image id), the steps after a mining score more keys than
    the batch, and the checkpoint keeps the mined rows."""
    mining = {
        "loss.mined_negatives": 4,
        "loss.mine_every": 3,
        "loss.mine_range": [2, 60],
        "loss.mine_margin": 0.05,
    }
    cfg, task, plan, runtime = in_process(tiny_dataset, tmp_path, **{"train.epoch_steps": 6, **mining})
    hooks = build_hooks(cfg, task, runtime, None)
    assert any(isinstance(h, CorpusNegativesHook) for h in hooks)  # wired by loss.mined_negatives
    steps = Steps()
    run_loop(cfg, task, runtime, plan, hooks=[*hooks, steps])
    assert [s["mined/from_step"] for s in steps.stats] == [0, 0, 0, 3, 3, 3]
    # the rows mined for a batch's samples are keys too (6 steps in, few samples have 4 below the margin)
    assert sum(s["neg/keys"] > cfg.train.batch_size for s in steps.stats) >= 4
    assert (
        capsys.readouterr().out.count("train rows (ranks 2-60, margin 0.05) mined; the batches use them") == 2
    )
    mined = task.loss_fn.mined
    img, cap = (nn.functional.normalize(mined.rows[n], dim=1).numpy() for n in ("img", "cap"))
    ids = mined.rows["image_id"].numpy()
    want = brute_force(img, cap, ids, ids, k=4, ranks=(2, 60), margin=0.05)
    np.testing.assert_array_equal(mined.table.numpy(), want)
    state = load_checkpoint(runtime.checkpoints[-1])[0]["corpus_negatives"]
    assert state["step"] == 3 and torch.equal(state["table"], mined.table)
    batch_ids = mined.rows["sample_id"][(mined.table >= 0).any(1)][:32]  # samples with mined rows
    extra = mined.rows_of(batch_ids)
    assert not torch.isin(extra["sample_id"], batch_ids).any() and len(extra["sample_id"].unique()) == len(
        extra["sample_id"]
    )


def test_a_bad_mining_range_is_one_line_naming_the_key() -> None:
    cfg = apply_overrides(Config(), {"loss.mined_negatives": 2, "loss.mine_range": [5, 3]})
    assert loss_problems(cfg) == ["loss.mine_range=[5, 3]: need [lo, hi] with 1 <= lo <= hi (ranks)"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ray_workers_mine_beside_training_swap_at_a_step_boundary_and_fill_the_queue(
    ray_cluster, tiny_dataset, tmp_path
):
    """With Ray Train workers a Ray actor mines from the weights of every 5th step while the workers train on; the
    workers take its rows at one step boundary, all of them at the same step (steps.jsonl: ``mined/from_step``, the
    step of the weights the rows come from; −1 before the first). The same fit holds a loss memory of 256 rows
    (``loss.memory_size``, tests/test_losses_memory.py): steps.jsonl logs its fill, one global batch a step up to
    its size (one Ray fit for both: each costs ~25 s of start-up on 2 cores)."""
    import json

    from raydist.runfiles import STEPS_FILE
    from raydist.train.trainer import run_training

    overrides = {"train.storage_path": str(tmp_path), "train.num_workers": 2, "train.log_every": 1}
    mining = {"loss.mined_negatives": 3, "loss.mine_every": 5, "loss.mine_range": [1, 50]}
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(tiny_dataset),
            "train.epochs": 1,
            "train.epoch_steps": 30,
            "loss.memory_size": 256,
            **overrides,
            **mining,
        },
    )
    outcome = run_training(cfg, evaluate_test=False)
    lines = [json.loads(line) for line in (Path(outcome.run_dir) / STEPS_FILE).read_text().splitlines()]
    mined = [line["stats"]["mined/from_step"] for line in lines]
    assert len(mined) == 30 and mined[0] == -1 and mined == sorted(mined), mined
    swaps = [i for i in range(1, 30) if mined[i] != mined[i - 1]]
    assert swaps and all(mined[i] % 5 == 0 and mined[i] < i for i in swaps), mined
    rows = cfg.train.batch_size
    assert [line["stats"]["memory/fill"] for line in lines] == [min(rows * (i + 1), 256) for i in range(30)]
