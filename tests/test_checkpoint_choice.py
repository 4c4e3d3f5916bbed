"""A run folder given to eval / retrieve / index / the Embedder means its best checkpoint by the run's val metric
(raydist.retrieval.trained.choose_trained, raydist.checkpoint.choose_checkpoint): the record a finished run writes, else each checkpoint's own reported
metric; ``--latest`` gives the newest; the output names the checkpoint and why."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from test_retrieval_trained import _config  # a tiny in-process labels run's config

from raydist.checkpoint import record_best_checkpoint, save_checkpoint
from raydist.cli import main
from raydist.retrieval.trained import choose_trained, evaluate_checkpoint
from raydist.runfiles import BEST_CHECKPOINT_FILE
from raydist.tasks import DataInfo, build_task
from raydist.train.trainer import run_training

METRIC = "val/top1"  # the labels task's primary metric with its default loss (cross-entropy)


def _checkpoint(run_dir: Path, data_dir: Path, step: int, score: float | None, seed: int) -> Path:
    """A checkpoint folder as the loop writes one at the end of an epoch (``loop.history``'s last entry is the
    epoch it ends, with its val metric), holding a freshly built model (seeded: each differs)."""
    cfg = _config(data_dir)
    info = DataInfo.from_dataset(data_dir)
    torch.manual_seed(seed)
    model = build_task(cfg, info).build_model()
    history = [{"epoch": 1, "step": step, **({METRIC: score} if score is not None else {})}]
    state = {"model": model.state_dict(), "loop": {"global_step": step, "history": history}}
    return save_checkpoint(
        run_dir / f"checkpoint_{step:08d}", state, cfg, task=info.to_json(), files=info.files
    )


@pytest.fixture()
def run_dir(labels_dataset, tmp_path) -> Path:
    """Two checkpoints; the newer one scored worse."""
    run = tmp_path / "run"
    _checkpoint(run, labels_dataset, 10, 90.0, seed=1)
    _checkpoint(run, labels_dataset, 20, 40.0, seed=2)
    return run


def test_a_run_folder_means_its_best_checkpoint_and_latest_its_newest(run_dir):
    older, newer = run_dir / "checkpoint_00000010", run_dir / "checkpoint_00000020"
    best = choose_trained(run_dir)
    assert best.path == older and best.reason == f"best by {METRIC} = 90"
    latest = choose_trained(run_dir, latest=True)
    assert latest.path == newer and latest.reason == "latest"
    given = choose_trained(newer, latest=False)
    assert given.path == newer and given.reason == "the checkpoint given"
    assert str(best) == f"{older} (best by {METRIC} = 90)"


def test_eval_of_a_run_folder_evaluates_the_best_and_names_it(run_dir, tmp_path, capsys):
    older, newer = run_dir / "checkpoint_00000010", run_dir / "checkpoint_00000020"
    want = {c: evaluate_checkpoint(c, split="val") for c in (older, newer)}
    assert want[older] != want[newer]  # the two models differ, so the metrics say which one ran
    for flags, chosen, why in (([], older, f"best by {METRIC}"), (["--latest"], newer, "latest")):
        out = tmp_path / "metrics.json"
        assert main(["eval", "--checkpoint", str(run_dir), "--split", "val", "--json", str(out), *flags]) == 0
        header = capsys.readouterr().out.splitlines()[0]
        assert header.startswith(f"val split, checkpoint {chosen} ({why}")
        assert json.loads(out.read_text()) == pytest.approx(want[chosen])


@pytest.mark.parametrize("command", ["retrieve", "index"])
def test_retrieve_and_index_name_the_checkpoint_they_use(run_dir, tmp_path, capsys, command):
    args = [command, "--checkpoint", str(run_dir), "--split", "val", "--dims", "16,64"]
    assert main([*args, "--out", str(tmp_path / command)]) == 0
    assert f"checkpoint {run_dir / 'checkpoint_00000010'} (best by {METRIC}" in capsys.readouterr().out
    assert main([*args, "--out", str(tmp_path / f"{command}-latest"), "--latest"]) == 0
    assert f"checkpoint {run_dir / 'checkpoint_00000020'} (latest)" in capsys.readouterr().out
    if command == "index":
        meta = json.loads((tmp_path / "index-latest" / "indexes.json").read_text())
        assert meta["checkpoint"] == str(run_dir / "checkpoint_00000020")


def test_the_record_of_a_finished_run_wins_until_a_newer_checkpoint_makes_it_stale(run_dir, labels_dataset):
    newer = run_dir / "checkpoint_00000020"
    record_best_checkpoint(run_dir, newer, METRIC, 40.0)  # contradicts the scores: shows the record is read
    chosen = choose_trained(run_dir)
    assert chosen.path == newer and chosen.reason == f"best by {METRIC} = 40"
    _checkpoint(run_dir, labels_dataset, 30, 50.0, seed=3)  # a resumed run went on without finishing
    assert choose_trained(run_dir).path == run_dir / "checkpoint_00000010"
    shutil.rmtree(run_dir / "checkpoint_00000030")
    (run_dir / BEST_CHECKPOINT_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=re.escape(str(run_dir / BEST_CHECKPOINT_FILE))):
        choose_trained(run_dir)


def test_without_scored_checkpoints_the_newest_is_used_and_said_so(labels_dataset, tmp_path):
    run = tmp_path / "run"
    _checkpoint(run, labels_dataset, 10, None, seed=1)  # no val metric (mid-epoch)
    _checkpoint(run, labels_dataset, 20, None, seed=2)
    chosen = choose_trained(run)
    assert (
        chosen.path == run / "checkpoint_00000020"
        and chosen.reason == f"latest: no checkpoint has a {METRIC}"
    )
    with pytest.raises(FileNotFoundError, match="neither a checkpoint folder"):
        choose_trained(tmp_path)


def test_a_finished_run_records_the_best_checkpoint_it_reports(labels_dataset, tmp_path):
    """A short in-process run (no Ray): the record names the outcome's best checkpoint, whose own reported
    metric is the highest of the run's checkpoints."""
    cfg = _config(
        labels_dataset,
        **{
            "train.epochs": 2,
            "train.keep_checkpoints": 2,
            "train.lr": 0.05,
            "train.storage_path": str(tmp_path / "runs"),
            "train.run_name": "r",
        },
    )
    outcome = run_training(cfg, evaluate_test=False)
    record = json.loads(Path(outcome.run_dir, BEST_CHECKPOINT_FILE).read_text())
    assert record["checkpoint"] == Path(outcome.best_checkpoint).name and record["metric"] == METRIC
    scores = {m["step"]: m[METRIC] for m in outcome.history}
    assert record["value"] == pytest.approx(max(scores.values()))
    assert choose_trained(outcome.run_dir).path == Path(outcome.best_checkpoint)
