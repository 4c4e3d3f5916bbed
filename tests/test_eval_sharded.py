"""Evaluation shared out over workers (raydist.distributed.shards, Task.evaluate_on_ranks): rank r embeds
batches r, r + W, …, one gather per embedding pass, rank 0 computes the metrics -- exactly the metrics one
process computes, on splits whose rows divide neither by the worker count nor by the batch size."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from raydist.cli import main
from raydist.data import make_synthetic
from raydist.data.synthetic_labels import make_synthetic_labels
from raydist.distributed.shards import batch_starts, map_batches, rows_of_rank, sharded_batches
from raydist.distributed.spawn import spawn
from raydist.retrieval.trained import load_trained
from raydist.train.hooks import ValidationHook

WORLD = 2
EVAL_BATCH = 4  # 13 images, 65 captions, 21 labelled rows: ragged last batches, an odd number of batches


@pytest.mark.parametrize(
    ("rows", "batch", "world"), [(21, 4, 2), (65, 4, 2), (3, 4, 2), (10, 3, 3), (0, 5, 2)]
)
def test_every_row_goes_to_exactly_one_rank_in_batches_of_one_process(rows, batch, world):
    shares = [rows_of_rank(rows, batch, r, world) for r in range(world)]
    assert sorted(np.concatenate(shares).tolist()) == list(range(rows))
    one_process = {(s, min(s + batch, rows)) for s in range(0, rows, batch)}
    per_rank = {(s, min(s + batch, rows)) for r in range(world) for s in batch_starts(rows, batch, r, world)}
    assert per_rank == one_process
    assert all(len(shares[0]) >= len(s) for s in shares)  # rank 0 holds the most rows: the others pad to it


def test_without_a_process_group_map_batches_is_the_plain_loop():
    x = torch.arange(22.0).reshape(11, 2)
    assert torch.equal(map_batches(lambda s, e: x[s:e] * 2, 11, 4), x * 2)
    left, right = map_batches(lambda s, e: (x[s:e, :1], x[s:e] + 1), 11, 4)
    assert torch.equal(left, x[:, :1]) and torch.equal(right, x + 1)


def _checkpoints(root: Path, make) -> dict[str, Path]:
    """An untrained checkpoint (random weights: non-trivial metrics) of each task on small odd splits."""
    pairs = make_synthetic(
        root / "pairs", images=20, captions_per_image=5, dim=16, seed=1, val_images=13, test_images=13
    )
    labels = make_synthetic_labels(
        root / "labels", classes=3, train_per_class=8, val_per_class=7, test_per_class=7, dim=16, seed=1
    )
    folder = "run/checkpoint_00000001"
    return {
        "pairs": make(root / "pairs" / folder, pairs, **{"eval.batch_size": EVAL_BATCH}),
        "labels": make(
            root / "labels" / folder, labels, **{"eval.batch_size": EVAL_BATCH, "model.nesting": [8, 64]}
        ),
    }


def _validate_on_ranks(rank: int, init_file: str, checkpoints: dict[str, str], out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    with sharded_batches():
        starts: list[int] = []
        rows = map_batches(lambda s, e: starts.append(s) or torch.arange(s, e)[:, None], 21, EVAL_BATCH)
        pair = map_batches(lambda s, e: (torch.zeros(e - s, 2), torch.ones(e - s, 3)), 3, EVAL_BATCH)
    assert torch.equal(rows[:, 0], torch.arange(21)) and [p.shape for p in pair] == [(3, 2), (3, 3)]
    results = {"starts": starts}
    for name, folder in checkpoints.items():
        trained = load_trained(folder)
        metrics: dict = {}
        ValidationHook(trained.task).end_of_epoch(SimpleNamespace(rank=rank), trained.model, metrics)
        results[name] = metrics
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.gloo
def test_validation_across_two_workers_equals_one_process(tmp_path, fresh_checkpoint):
    checkpoints = {k: str(v) for k, v in _checkpoints(tmp_path, fresh_checkpoint).items()}
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spawn(_validate_on_ranks, (str(tmp_path / "init"), checkpoints, str(tmp_path)), nprocs=WORLD)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert [r["starts"] for r in ranks] == [[0, 8, 16], [4, 12, 20]]  # each rank embeds its own batches
    assert ranks[1] == {"starts": [4, 12, 20], "pairs": {}, "labels": {}}  # metrics computed once, on rank 0
    for name, folder in checkpoints.items():
        single = {f"val/{k}": v for k, v in load_trained(folder).evaluate("val").items()}
        assert ranks[0][name] == single, name  # exactly equal, every metric
    assert "val/min_dim_r1" in ranks[0]["labels"] and "val/rsum" in ranks[0]["pairs"]


@pytest.mark.slow
@pytest.mark.gloo
def test_raydist_eval_with_two_workers_prints_the_one_process_metrics(tmp_path, fresh_checkpoint):
    folder = _checkpoints(tmp_path, fresh_checkpoint)["pairs"]
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert main(["eval", "--checkpoint", str(folder), "--split", "test", "--json", str(one)]) == 0
    assert (
        main(
            ["eval", "--checkpoint", str(folder), "--split", "test", "--num-workers", "2", "--json", str(two)]
        )
        == 0
    )
    assert json.loads(two.read_text()) == json.loads(one.read_text())
