"""raydist.retrieval.trained: one loader from a checkpoint to a model (weights, data checks, dims), and resume
compatibility judged from the saved state (tensor names and shapes), not from a list of config keys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from raydist.checkpoint import save_checkpoint
from raydist.checkpoint.names import TENSORS_FILE
from raydist.cli import main
from raydist.config import ConfigError, load_config
from raydist.data.synthetic_labels import make_synthetic_labels
from raydist.retrieval.trained import load_trained, resume_checkpoint
from raydist.tasks import DataInfo, build_task
from raydist.train.local import LocalRuntime
from raydist.train.loop import run_loop
from raydist.train.plan import step_plan

CLASSES = 10  # labels_dataset (tests/conftest.py)


def _config(data_dir: Path, **overrides):
    return load_config(
        "tiny",
        overrides={
            "data.path": str(data_dir),
            "train.num_workers": 0,
            "train.epochs": 1,
            "train.batch_size": 64,
            **overrides,
        },
    )


def _checkpoint(folder: Path, data_dir: Path, **overrides) -> Path:
    """A checkpoint folder of a freshly built model (no training needed to test loading and resuming)."""
    cfg = _config(data_dir, **overrides)
    info = DataInfo.from_dataset(data_dir)
    torch.manual_seed(0)
    model = build_task(cfg, info).build_model()
    return save_checkpoint(folder, {"model": model.state_dict()}, cfg, task=info.to_json(), files=info.files)


def test_loaded_model_holds_the_saved_weights_in_eval_mode(labels_dataset, tmp_path):
    folder = _checkpoint(
        tmp_path / "run" / "checkpoint_00000003", labels_dataset, **{"model.nesting": [16, 64]}
    )
    trained = load_trained(tmp_path / "run")  # a run folder, and the dataset the checkpoint records
    saved = {k.removeprefix("model/"): v for k, v in load_file(folder / TENSORS_FILE).items()}
    loaded = trained.model.state_dict()
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)
    assert not trained.model.training and trained.checkpoint_path == folder
    assert trained.data_info.data_dir == labels_dataset and trained.task.name == "labels"
    assert trained.retrieval_dims() == [16, 64] and trained.retrieval_dims([8]) == [8]
    rset = trained.embed("val")
    assert rset.source == str(folder) and rset.split == "val" and rset.database.shape == (CLASSES * 20, 64)


def test_dims_without_nesting_are_the_powers_of_two_and_the_full_dim(labels_dataset, tmp_path):
    trained = load_trained(_checkpoint(tmp_path / "c", labels_dataset))
    assert trained.trained_dims() is None and trained.retrieval_dims() == [8, 16, 32, 64]


def test_data_that_does_not_fit_is_refused_naming_both_sides(labels_dataset, tmp_path):
    folder = _checkpoint(tmp_path / "c", labels_dataset)
    other = make_synthetic_labels(
        tmp_path / "other", classes=4, train_per_class=5, val_per_class=5, test_per_class=5, dim=16, seed=1
    )
    with pytest.raises(
        ConfigError, match=r"(?s)feature_dim: checkpoint=32 data=16.*num_classes: checkpoint=10 data=4"
    ):
        load_trained(folder, other)
    with pytest.raises(ConfigError, match=r"feature_dim: checkpoint=32 data=16"):
        resume_checkpoint(folder, _config(other), other)


def test_resume_changing_nesting_of_a_labels_model_exits_2_naming_the_key(labels_dataset, tmp_path, capsys):
    folder = _checkpoint(tmp_path / "c", labels_dataset)
    code = main(
        [
            "train",
            "--resume",
            str(folder),
            "--storage",
            str(tmp_path / "runs"),
            "model.nesting=[16,64]",
            "train.lr=0.01",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "cannot change model.nesting when resuming" in err and "train.lr" not in err.split("\n")[0]
    assert "model.nesting: checkpoint=[] run=[16, 64]" in err


def test_a_change_that_keeps_every_shape_is_accepted(labels_dataset, tmp_path):
    folder = _checkpoint(tmp_path / "c", labels_dataset)
    cfg = _config(labels_dataset, **{"loss.margin": 0.5, "train.epochs": 3, "model.nesting": []})
    assert resume_checkpoint(folder, cfg, labels_dataset) == folder
    with pytest.raises(ConfigError, match=r"cannot change model.embed_dim"):  # the same check can refuse
        resume_checkpoint(folder, _config(labels_dataset, **{"model.embed_dim": 48}), labels_dataset)


def test_a_per_class_beta_cannot_replace_a_scalar_one(labels_dataset, tmp_path):
    margin = {"loss.kind": "margin", "loss.miner": "distance-weighted"}
    folder = _checkpoint(tmp_path / "c", labels_dataset, **margin)
    cfg = _config(labels_dataset, **margin, **{"loss.beta_per_class": True})
    with pytest.raises(ConfigError) as refused:
        resume_checkpoint(folder, cfg, labels_dataset)
    message = str(refused.value)
    assert message.startswith("cannot change loss.beta_per_class when resuming")
    assert re.search(rf"beta\S*: checkpoint=\[\] run=\[{CLASSES}\]", message)
    with pytest.raises(ConfigError, match=r"cannot change loss.kind"):  # cross-entropy has no beta
        resume_checkpoint(folder, _config(labels_dataset), labels_dataset)


def test_the_loop_refuses_a_checkpoint_its_model_does_not_fit(labels_dataset, tmp_path):
    """A run restarted with another config (run_loop's own restore, in every worker) is refused the same way."""
    folder = _checkpoint(tmp_path / "c", labels_dataset)
    cfg = _config(labels_dataset, **{"model.nesting": [16, 64]})
    task = build_task(cfg, DataInfo.from_dataset(labels_dataset))
    plan = step_plan(cfg, task.info.task)
    with pytest.raises(ConfigError, match="cannot change model.nesting"):
        run_loop(cfg, task, LocalRuntime(cfg, task, plan, tmp_path / "run"), plan, resume_from=str(folder))
