"""Tasks: a third task written in this file (one class, registered) trains in-process; the shipped
``labels`` task trains end to end with 2 Ray Train workers on a synthetic labelled set."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raydist.cli import main
from raydist.config import load_config
from raydist.data import feature_matrix, read_split, validate_dataset
from raydist.tasks import DataInfo, Encoded, Task, build_task, register_task, task_names
from raydist.train.hooks import ValidationHook
from raydist.train.local import LocalRuntime
from raydist.train.loop import run_loop
from raydist.train.plan import step_plan


@register_task
class NearestCentroidTask(Task):
    """Toy task: a linear map into K dims trained to put each row near its class's one-hot vector (MSE);
    evaluated by the accuracy of the argmax."""

    name = "toy-centroid"
    columns = ("image", "label")
    primary_metric = "acc"
    gathers = False

    def transform(self, batch):
        return {"x": feature_matrix(batch["image"]), "y": np.asarray(batch["label"], dtype=np.int64)}

    def build_model(self):
        return nn.Linear(self.info.feature_dim, self.info.num_classes)

    def encode(self, model, batch):
        return Encoded({"out": model(batch["x"])}, {"y": batch["y"]})

    def loss(self, encoded, gathered, negative_set, ctx, stats):
        target = F.one_hot(encoded.ids["y"], self.info.num_classes).float()
        return F.mse_loss(encoded.embeddings["out"], target)

    @torch.no_grad()
    def evaluate(self, model, split, device="cpu"):
        table = read_split(self.info.data_dir, split, verify=False)
        pred = model(torch.tensor(feature_matrix(table.column("image")))).argmax(1).numpy()
        return {"acc": 100.0 * float((pred == table.column("label").to_numpy()).mean())}


def test_a_new_task_is_one_registered_class(labels_dataset, tmp_path):
    data = tmp_path / "toy"
    shutil.copytree(labels_dataset, data)
    manifest = json.loads((data / "manifest.json").read_text())
    (data / "manifest.json").write_text(json.dumps({**manifest, "task": "toy-centroid"}))
    assert "toy-centroid" in task_names()
    validate_dataset(data).raise_if_problems()
    cfg = load_config(
        "tiny",
        overrides={"data.path": str(data), "train.num_workers": 1, "train.epochs": 4, "train.lr": 0.02},
    )
    task = build_task(cfg, DataInfo.from_dataset(data))
    assert isinstance(task, NearestCentroidTask)
    plan = step_plan(cfg, task.info.task)
    runtime = LocalRuntime(cfg, task, plan, tmp_path / "run")
    out = run_loop(cfg, task, runtime, plan, hooks=[ValidationHook(task)])
    assert out["history"][-1]["val/acc"] > 40  # 10 classes: chance 10 %


@pytest.fixture(scope="module")
def separable_labels(tmp_path_factory):
    data = tmp_path_factory.mktemp("labels") / "labels"
    assert (
        main(
            [
                "make-data",
                "synthetic-labels",
                "--out",
                str(data),
                "--classes",
                "10",
                "--train-per-class",
                "80",
                "--val-per-class",
                "20",
                "--test-per-class",
                "30",
                "--dim",
                "32",
                "--overlap",
                "0.05",
                "--seed",
                "1",
            ]
        )
        == 0
    )
    return data


@pytest.mark.timeout(240)
def test_labels_task_trains_end_to_end_from_the_command_line(separable_labels, tmp_path, capsys):
    """`raydist train` on labelled data with the preset's loss, in process (train.num_workers=0): the labels
    task across 2 Ray workers is the next test's run (triplet, noisy labels), so this one starts no Ray."""
    data = separable_labels
    out_json = tmp_path / "outcome.json"
    code = main(
        [
            "train",
            "--preset",
            "tiny",
            "--data",
            str(data),
            "--storage",
            str(tmp_path / "runs"),
            "--json",
            str(out_json),
            "train.epochs=4",
            "train.lr=0.005",
            "train.num_workers=0",
        ]
    )
    assert code == 0
    outcome = json.loads(out_json.read_text())
    assert outcome["test_metrics"]["top1"] > 50, outcome["test_metrics"]  # chance: 10 %
    assert outcome["test_metrics"]["r1"] > 50
    assert "top-1" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_triplet_loss_under_label_noise_trains_end_to_end_with_two_workers(
    ray_cluster, separable_labels, tmp_path
):
    """Triplet loss, random semi-hard mining over the batch gathered from 2 workers, 20 % of the train labels
    flipped: clean-label test Recall@1 far above chance (10 %)."""
    out_json = tmp_path / "outcome.json"
    code = main(
        [
            "train",
            "--preset",
            "tiny",
            "--data",
            str(separable_labels),
            "--storage",
            str(tmp_path / "runs"),
            "--json",
            str(out_json),
            "train.epochs=4",
            "train.lr=0.005",
            "train.batch_size=64",
            "loss.kind=triplet",
            "loss.miner=semihard-random",
            "data.label_noise=0.2",
        ]
    )
    assert code == 0
    metrics = json.loads(out_json.read_text())["test_metrics"]
    assert metrics["r1"] > 50, metrics


def _fit(data, **overrides):
    """The config `raydist train --data DATA key=value ...` runs (default preset, the dataset's task block),
    checked against the dataset's task."""
    from raydist.data import dataset_task
    from raydist.tasks import check_task_config

    cfg = load_config("default", overrides={"data.path": str(data), **overrides}, task_of=dataset_task)
    check_task_config(cfg, DataInfo.from_dataset(data))
    return cfg


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"loss.kind": "triplet", "loss.miner": "hardest"}, "loss.kind=triplet"),
        ({"loss.miner": "hardest"}, "loss.miner=hardest"),
        ({"loss.beta": 0.5}, "loss.beta=0.5"),
        ({"data.label_noise": 0.2}, "data.label_noise=0.2"),
    ],
)
def test_pairs_task_refuses_keys_and_values_of_the_labels_task(tiny_dataset, overrides, key):
    from raydist.config import ConfigError

    with pytest.raises(ConfigError) as info:
        _fit(tiny_dataset, **overrides)
    lines = [line.strip() for line in str(info.value).splitlines()[1:]]
    assert len(lines) == len(overrides)  # one line per key
    line = next(line for line in lines if line.startswith(key + ":"))
    assert f"the pairs task ({tiny_dataset})" in line and "labels task" in line


@pytest.mark.parametrize(
    "overrides, key, says",
    [
        (
            {"loss.kind": "ranking"},
            "loss.kind=ranking",
            "trains loss.kind auto, cross_entropy, triplet, margin",
        ),
        ({"loss.hardest": False}, "loss.hardest=false", "it is for the pairs task"),
        ({"loss.warmup_sh_epochs": 2}, "loss.warmup_sh_epochs=2", "it is for the pairs task"),
        ({"loss.warmup_sh_steps": 50}, "loss.warmup_sh_steps=50", "it is for the pairs task"),
        ({"model.word_dim": 64}, "model.word_dim=64", "it is for the pairs task"),
        (
            {"loss.miner": "hardest"},
            "loss.miner=hardest",
            "only with loss.kind triplet/margin, not cross_entropy",
        ),
        ({"loss.kind": "triplet", "loss.nu": 0.1}, "loss.nu=0.1", "only with loss.kind margin, not triplet"),
    ],
)
def test_labels_task_refuses_what_it_ignores(labels_dataset, overrides, key, says):
    from raydist.config import ConfigError

    with pytest.raises(ConfigError) as info:
        _fit(labels_dataset, **overrides)
    (line,) = [line.strip() for line in str(info.value).splitlines()[1:]]
    assert line.startswith(key + ":") and f"the labels task ({labels_dataset})" in line and says in line


def test_each_task_accepts_its_own_keys_and_every_shipped_preset(tiny_dataset, labels_dataset):
    from raydist.config import preset_names

    _fit(
        labels_dataset,
        **{
            "loss.kind": "triplet",
            "loss.miner": "hardest",
            "loss.hinged": False,
            "loss.margin": 0.3,
            "data.label_noise": 0.2,
            "model.mlp_hidden": [64],
        },
    )
    _fit(
        labels_dataset, **{"loss.kind": "margin", "loss.beta": 0.9, "loss.nu": 0.1, "eval.recall_at": [1, 5]}
    )
    _fit(
        tiny_dataset,
        **{
            "loss.hardest": False,
            "loss.warmup_sh_steps": 10,
            "model.word_dim": 16,
            "eval.folds": 5,
            "loss.kind": "ranking",
        },
    )
    for preset in preset_names():  # the preset's values for the other task never reach a run
        for data in (tiny_dataset, labels_dataset):
            from raydist.data import dataset_task
            from raydist.tasks import check_task_config

            cfg = load_config(preset, overrides={"data.path": str(data)}, task_of=dataset_task)
            check_task_config(cfg, DataInfo.from_dataset(data))


def test_presets_give_labels_runs_no_pairs_values(labels_dataset, tiny_dataset):
    """The default preset's `tasks.pairs` block (read here from the YAML itself) reaches pairs runs only."""
    from importlib import resources

    import yaml

    from raydist.config import Config, flatten

    doc = yaml.safe_load((resources.files("raydist.presets") / "default.yaml").read_text())
    pairs_only = flatten(doc["tasks"]["pairs"])
    assert {"loss.warmup_sh_epochs", "train.min_steps"} <= set(pairs_only)
    labels, pairs, defaults = _fit(labels_dataset).flat(), _fit(tiny_dataset).flat(), Config().flat()
    for key, value in pairs_only.items():
        assert pairs[key] == value and labels[key] == defaults[key], key
    for key, value in flatten({k: v for k, v in doc.items() if k != "tasks"}).items():
        assert labels[key] == value == pairs[key], key


def test_cli_refuses_a_key_the_task_ignores_before_ray_starts(labels_dataset, tmp_path, capsys):
    """In-process: an unmarked test fails if anything calls ray.init (tests/conftest.py)."""
    code = main(["train", "--data", str(labels_dataset), "--storage", str(tmp_path), "loss.kind=ranking"])
    err = capsys.readouterr().err
    assert code == 2 and f"loss.kind=ranking: the labels task ({labels_dataset})" in err, err


def test_data_info_carries_a_datasets_standardization_file(tmp_path):
    from raydist.converters.npz import convert_npz

    x = np.random.default_rng(0).normal(size=(60, 3))
    np.savez(tmp_path / "d.npz", X=x, y=np.arange(60) % 3)
    scaled = convert_npz(tmp_path / "d.npz", tmp_path / "scaled", standardize=True)
    plain = convert_npz(tmp_path / "d.npz", tmp_path / "plain")
    assert DataInfo.from_dataset(scaled).files == {"standardization.json": scaled / "standardization.json"}
    assert DataInfo.from_dataset(plain).files == {}
    assert DataInfo.from_dataset(scaled).to_json()["files"] == ["standardization.json"]
