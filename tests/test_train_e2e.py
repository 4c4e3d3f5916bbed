"""End-to-end: Ray Data shards → 2 Ray Train workers (gloo DDP) → VSE++ loss → val retrieval."""

import json
import os
import time
from pathlib import Path

import pytest
import torch

from raydist.config import load_config
from raydist.data import Vocab, load_manifest, split_arrays
from raydist.eval.evaluate import evaluate_arrays
from raydist.models import build_model
from raydist.retrieval.trained import evaluate_checkpoint
from raydist.train.trainer import run_training


def untrained_rsum(cfg, data_dir) -> float:
    torch.manual_seed(cfg.train.seed)
    vocab = Vocab.load(data_dir / "vocab.json")
    model = build_model(cfg, load_manifest(data_dir).feature_dim, len(vocab))
    return evaluate_arrays(model, vocab, split_arrays(data_dir, "val"), max_len=cfg.data.max_caption_len)[
        "rsum"
    ]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tiny_two_workers_stream_the_train_split_through_ray_data_and_learn(
    ray_cluster, tiny_dataset, tmp_path
):
    """data.in_memory_max_mb=0 forces the Ray Data path (read_parquet → map_batches → streaming_split): every
    epoch runs the same global steps as the in-memory path (2000 rows // 32), the model learns, and the best
    checkpoint reproduces its score outside Ray. (Most other 2-worker runs of the suite read in memory; this one
    run covers both claims: one Ray Train fit instead of two.)"""
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(tiny_dataset),
            "train.storage_path": str(tmp_path),
            "train.epochs": 3,
            "data.in_memory_max_mb": 0,
        },
    )
    before = untrained_rsum(cfg, tiny_dataset)
    started = time.time()
    outcome = run_training(cfg)
    # the first optimizer step's wall-clock time (rank 0), as the CLI and `raydist bench startup` report it, after
    # the start-up marks of the driver and of rank 0, in their order
    assert started < outcome.first_step_unix < time.time()
    marks = [outcome.startup[key] for key in ("data_checked", "ray_ready", "workers_started", "data_ready")]
    assert started < marks[0] <= marks[1] <= marks[2] <= marks[3] <= outcome.first_step_unix
    assert [m["epoch"] for m in outcome.history] == [1, 2, 3]
    assert [m["step"] for m in outcome.history] == [2000 // 32, 2 * (2000 // 32), 3 * (2000 // 32)]
    assert json.loads((Path(outcome.run_dir) / "history.json").read_text()) == outcome.history
    after = outcome.history[-1]["val/rsum"]
    assert after > before + 60, (before, outcome.history)
    # The best checkpoint reloads and reproduces its validation score outside Ray.
    best = outcome.best_metrics["val/rsum"]
    assert best == max(m["val/rsum"] for m in outcome.history)
    again = evaluate_checkpoint(outcome.best_checkpoint, tiny_dataset, "val", folds=1)["rsum"]
    assert again == pytest.approx(best, abs=1e-6)
    assert outcome.test_metrics["rsum"] > before + 60


def test_the_train_controller_polls_every_half_second_unless_the_user_sets_it(
    tiny_dataset, tmp_path, monkeypatch
):
    """Ray Train's controller reads its poll interval from the environment fit() runs in: raydist sets 0.5 s
    (a run ends at the first poll after its workers return; Ray's 2 s default costs seconds per run) and keeps
    a value the user exported."""
    from raydist.train.plan import prepare_run
    from raydist.train.trainer import POLL_INTERVAL_ENV, build_trainer

    cfg = load_config("tiny", overrides={"data.path": str(tiny_dataset)})
    monkeypatch.delenv(POLL_INTERVAL_ENV, raising=False)
    plan = prepare_run(cfg)
    build_trainer(plan, storage_path=str(tmp_path))
    assert float(os.environ[POLL_INTERVAL_ENV]) == 0.5
    monkeypatch.setenv(POLL_INTERVAL_ENV, "3")
    build_trainer(plan, storage_path=str(tmp_path))
    assert os.environ[POLL_INTERVAL_ENV] == "3"
