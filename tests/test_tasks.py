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
from raydist.distributed import StepPlan
from raydist.tasks import DataInfo, Encoded, Task, build_task, register_task, task_names
from raydist.train.hooks import ValidationHook
from raydist.train.local import LocalRuntime
from raydist.train.loop import run_loop


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
        pred = model(torch.as_tensor(feature_matrix(table.column("image")))).argmax(1).numpy()
        return {"acc": 100.0 * float((pred == table.column("label").to_numpy()).mean())}


def test_a_new_task_is_one_registered_class(labels_dataset, tmp_path):
    data = tmp_path / "toy"
    shutil.copytree(labels_dataset, data)
    manifest = json.loads((data / "manifest.json").read_text())
    (data / "manifest.json").write_text(json.dumps({**manifest, "task": "toy-centroid"}))
    assert "toy-centroid" in task_names()
    validate_dataset(data).raise_if_problems()
    cfg = load_config("tiny", overrides={"data.path": str(data), "train.num_workers": 1, "train.epochs": 4,
                                         "train.lr": 0.02})  # fmt: skip
    task = build_task(cfg, DataInfo.from_dataset(data))
    assert isinstance(task, NearestCentroidTask)
    plan = StepPlan.from_config(cfg)
    runtime = LocalRuntime(cfg, task, plan, tmp_path / "run")
    out = run_loop(cfg, task, runtime, plan, hooks=[ValidationHook(task)])
    assert out["history"][-1]["val/acc"] > 40  # 10 classes: chance 10 %


@pytest.fixture(scope="module")
def separable_labels(tmp_path_factory):
    data = tmp_path_factory.mktemp("labels") / "labels"
    assert main(["make-data", "synthetic-labels", "--out", str(data), "--classes", "10", "--train-per-class",
                 "80", "--val-per-class", "20", "--test-per-class", "30", "--dim", "32", "--overlap", "0.05",
                 "--seed", "1"]) == 0  # fmt: skip
    return data


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_labels_task_trains_end_to_end_with_two_workers(ray_cluster, separable_labels, tmp_path, capsys):
    data = separable_labels
    out_json = tmp_path / "outcome.json"
    code = main(["train", "--preset", "tiny", "--data", str(data), "--storage", str(tmp_path / "runs"),
                 "--json", str(out_json), "train.epochs=4", "train.lr=0.005"])  # fmt: skip
    assert code == 0
    outcome = json.loads(out_json.read_text())
    assert outcome["test_metrics"]["top1"] > 50, outcome["test_metrics"]  # chance: 10 %
    assert outcome["test_metrics"]["r1"] > 50
    assert "top-1" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_triplet_loss_under_label_noise_trains_end_to_end_with_two_workers(ray_cluster, separable_labels, tmp_path):
    """Triplet loss, random semi-hard mining over the batch gathered from 2 workers, 20 % of the train labels
    flipped: clean-label test Recall@1 far above chance (10 %)."""
    out_json = tmp_path / "outcome.json"
    code = main(["train", "--preset", "tiny", "--data", str(separable_labels), "--storage", str(tmp_path / "runs"),
                 "--json", str(out_json), "train.epochs=4", "train.lr=0.005", "train.batch_size=64",
                 "loss.kind=triplet", "loss.miner=semihard-random", "data.label_noise=0.2"])  # fmt: skip
    assert code == 0
    metrics = json.loads(out_json.read_text())["test_metrics"]
    assert metrics["r1"] > 50, metrics
