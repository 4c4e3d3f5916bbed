"""Reusing a run's name (``--name``): an unfinished run with the same config continues; a finished run and a
changed config are refused before Ray starts, with the ``changed:`` line that ``--resume`` prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from raydist.checkpoint import format_changes, resumed_config, save_checkpoint
from raydist.cli import main
from raydist.config import ConfigError, apply_overrides, load_config
from raydist.train.loop import LoopState
from raydist.train.trainer import named_run_decision


def _config(tmp_path: Path, **overrides):
    base = {"train.storage_path": str(tmp_path / "runs"), "train.run_name": "r", "train.epochs": 4}
    return load_config("tiny", overrides={**base, **overrides})


def _saved_run(
    cfg, *, epoch: int, step: int, finished: bool = False, name: str = "checkpoint_00000010"
) -> Path:
    """A run folder with one checkpoint of ``cfg`` whose loop counters say where it stopped."""
    loop = LoopState(epoch=epoch, step_in_epoch=0, global_step=step, finished=finished)
    folder = Path(cfg.train.storage_path) / cfg.train.run_name / name
    return save_checkpoint(folder, {"loop": vars(loop)}, cfg)


def test_no_run_of_that_name_starts_fresh(tmp_path):
    assert named_run_decision(_config(tmp_path)) == ("new", None)
    (tmp_path / "runs" / "r").mkdir(parents=True)  # a folder without a checkpoint (a run that died early)
    assert named_run_decision(_config(tmp_path)) == ("new", None)


def test_an_unfinished_run_with_the_same_config_resumes(tmp_path):
    cfg = _config(tmp_path)
    checkpoint = _saved_run(cfg, epoch=2, step=20)
    # the storage path is how the folder was found, not part of the comparison
    same = apply_overrides(cfg, {"train.storage_path": str(tmp_path / "runs" / ".." / "runs")})
    action, run = named_run_decision(same)
    assert action == "resume" and run.checkpoint == checkpoint and (run.epoch, run.step) == (2, 20)
    assert run.changes == [] and not run.finished


@pytest.mark.parametrize(
    "loop",
    [{"epoch": 4, "step": 40}, {"epoch": 2, "step": 20, "finished": True}],
    ids=["all-epochs", "early-stop"],
)
def test_a_finished_run_is_refused_unless_forced(tmp_path, loop):
    cfg = _config(tmp_path)
    _saved_run(cfg, **loop)
    with pytest.raises(ConfigError) as refused:
        named_run_decision(cfg)
    message = str(refused.value)
    assert "'r'" in message and "is finished" in message and "--force" in message and "new --name" in message
    action, run = named_run_decision(cfg, force=True)
    assert action == "restart" and run.finished


def test_a_changed_config_is_refused_with_the_lines_resume_prints(tmp_path):
    cfg = _config(tmp_path)
    checkpoint = _saved_run(cfg, epoch=1, step=10)
    changes = {"loss.margin": 0.5, "train.epochs": 6}
    with pytest.raises(ConfigError) as refused:
        named_run_decision(apply_overrides(cfg, changes))
    message = str(refused.value)
    _, lines = resumed_config(checkpoint, changes)  # what `raydist train --resume RUN key=value ...` prints
    assert lines == [f"loss.margin: {cfg.loss.margin!r} -> 0.5", f"train.epochs: {cfg.train.epochs!r} -> 6"]
    assert format_changes(lines) in message
    assert f"raydist train --resume {checkpoint.parent} key=value" in message and "new --name" in message


def test_the_cli_refuses_a_finished_name_before_ray_starts(tmp_path, tiny_dataset, capsys):
    """Two Ray Train workers asked for: the refusal must come before Ray starts (this test is not marked slow,
    so starting Ray would fail it), with exit 2 as for other config errors."""
    cfg = _config(tmp_path, **{"data.path": str(tiny_dataset), "train.epochs": 1})
    _saved_run(cfg, epoch=1, step=62)
    code = main(
        [
            "train",
            "--preset",
            "tiny",
            "--data",
            str(tiny_dataset),
            "--storage",
            str(tmp_path / "runs"),
            "--name",
            "r",
            "train.epochs=1",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "raydist: error: run 'r'" in err and "is finished" in err
