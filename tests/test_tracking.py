"""Experiment tracking (raydist/train/tracking.py): TensorBoard event files and steps.jsonl written by rank 0
during a LocalRuntime run, checked against the loop's history; a resumed run drops what came after its
checkpoint; MLflow is optional and its absence is a clear error."""

from __future__ import annotations

import importlib.util
import json
import struct
import time
from collections import defaultdict

import numpy as np
import pytest

from raydist.config import ConfigError, load_config
from raydist.tasks import DataInfo, StepContext, build_task
from raydist.train.local import LocalRuntime
from raydist.train.loop import run_loop
from raydist.train.plan import step_plan
from raydist.train.tracking import TrackingHook
from raydist.train.wiring import build_hooks


def _config(data_dir, **overrides):
    """The tiny preset on half the train images (31 steps of 32 rows an epoch)."""
    base = {"data.path": str(data_dir), "train.num_workers": 1, "data.train_fraction": 0.5}
    return load_config("tiny", overrides={**base, **overrides})


def _train(cfg, data_dir, run_dir):
    """run_loop in this process with the run's hooks (validation, tracking) writing into ``run_dir``."""
    task = build_task(cfg, DataInfo.from_dataset(data_dir))
    plan = step_plan(cfg, task.info.task)
    runtime = LocalRuntime(cfg, task, plan, run_dir)
    return run_loop(cfg, task, runtime, plan, hooks=build_hooks(cfg, task, runtime, str(run_dir)))


def read_events(path):
    """The events of one TensorBoard file: TFRecords ``[u64 length][u32 crc][Event proto][u32 crc]``."""
    from tensorboardX.proto.event_pb2 import Event

    events, data, pos = [], path.read_bytes(), 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        events.append(Event.FromString(data[pos + 12 : pos + 12 + length]))
        pos += 12 + length + 4
    return events


def event_files(run_dir):
    return sorted(run_dir.glob("events.out.tfevents.*"))


def scalars(run_dir):
    """``{tag: [(step, value), ...]}`` of the scalar summaries of all the run's event files."""
    out = defaultdict(list)
    for event in (e for path in event_files(run_dir) for e in read_events(path)):
        for value in event.summary.value:
            out[value.tag].append((event.step, value.simple_value))
    return out


def _steps(run_dir):
    return [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]


def test_every_step_and_epoch_is_logged_and_matches_the_history(tiny_dataset, tmp_path):
    cfg = _config(tiny_dataset, **{"train.epochs": 2, "train.log_every": 1})
    out = _train(cfg, tiny_dataset, tmp_path)
    history = out["history"]
    steps = _steps(tmp_path)
    assert [s["step"] for s in steps] == list(range(1, out["global_step"] + 1))
    # one process: every step scored the configured global batch against all of its rows
    assert {(s["world"], s["stats"]["neg/queries"], s["stats"]["neg/keys"]) for s in steps} == {
        (1, cfg.train.batch_size, cfg.train.batch_size)
    }
    assert [h["world"] for h in history] == [1, 1]
    for h, first in zip(history, [0, history[0]["step"]], strict=False):
        mine = [s for s in steps if first < s["step"] <= h["step"]]
        assert {s["epoch"] for s in mine} == {h["epoch"]}
        # the loop's epoch means are the means of the per-step values (one rank)
        assert np.mean([s["loss"] for s in mine]) == pytest.approx(h["train/loss"], rel=1e-9)
        for stat in ("neg/hardest_sim", "neg/remote_hardest_frac"):
            assert np.mean([s["stats"][stat] for s in mine]) == pytest.approx(h[f"train/{stat}"], rel=1e-9)

    logged = scalars(tmp_path)
    assert [step for step, _ in logged["step/loss"]] == [s["step"] for s in steps]
    np.testing.assert_allclose([v for _, v in logged["step/loss"]], [s["loss"] for s in steps], rtol=1e-6)
    np.testing.assert_allclose(
        [v for _, v in logged["step/neg/hardest_sim"]],
        [s["stats"]["neg/hardest_sim"] for s in steps],
        rtol=1e-5,
    )
    for key in ("train/loss", "val/rsum", "val/i2t_r1", "val/t2i_r1", "loss/hardest"):
        assert logged[key] == [(h["step"], pytest.approx(h[key], rel=1e-6)) for h in history], key
    assert "phase" not in logged and "epoch" not in logged and "step" not in logged


def test_log_every_and_tensorboard_off(tiny_dataset, tmp_path):
    cfg = _config(tiny_dataset, **{"train.log_every": 20, "train.tensorboard": False})
    hook = TrackingHook(cfg, tmp_path)
    before = time.time()
    for step in range(65):
        hook.after_step(
            StepContext(step // 30, step, 0, 2 if step < 30 else 3), float(step), {"neg/keys": 32.0}
        )
    epoch_metrics = {"train/loss": 1.0}
    hook.end_of_epoch(StepContext(1, 65, 0, 3), None, epoch_metrics)
    steps = _steps(tmp_path)
    # steps.jsonl keeps times to the millisecond (rounded), so a step within 0.5 ms of `before` may read below it
    assert all(before - 1e-3 <= s.pop("time") <= time.time() + 1e-3 for s in steps)
    assert steps == [
        {
            "step": s,
            "epoch": (s - 1) // 30 + 1,
            "world": 2 if s <= 30 else 3,
            "loss": s - 1.0,
            "stats": {"neg/keys": 32.0},
        }
        for s in (20, 40, 60)
    ]
    assert epoch_metrics["world"] == 3  # history.json shows the workers of each epoch
    assert not event_files(tmp_path)


def test_a_resumed_run_drops_what_came_after_its_checkpoint(tiny_dataset, tmp_path):
    """Epoch 1 is checkpointed; an interrupted attempt logged steps past it (fake lines); the run restarted
    under its folder resumes from the checkpoint, replaces those lines and purges them in TensorBoard."""
    first = _train(_config(tiny_dataset, **{"train.epochs": 1, "train.log_every": 1}), tiny_dataset, tmp_path)
    done = first["global_step"]
    with (tmp_path / "steps.jsonl").open("a") as f:
        for step in range(done + 1, done + 4):
            f.write(json.dumps({"step": step, "epoch": 2, "loss": -1.0, "stats": {}}) + "\n")
    out = _train(_config(tiny_dataset, **{"train.epochs": 2, "train.log_every": 1}), tiny_dataset, tmp_path)
    assert out["resumed_at"] == [done]
    steps = _steps(tmp_path)
    assert [s["step"] for s in steps] == list(range(1, out["global_step"] + 1))
    assert all(s["loss"] > 0 for s in steps)
    files = event_files(tmp_path)
    assert len(files) == 2
    restarts = [[e.step for e in read_events(path) if e.HasField("session_log")] for path in files]
    assert restarts == [[1], [done + 1]]  # TensorBoard hides the earlier files' events at steps >= these


def test_only_rank_0_logs_and_remote_storage_writes_no_files(tiny_dataset, tmp_path, capsys):
    cfg = _config(tiny_dataset, **{"train.log_every": 1})
    hook = TrackingHook(cfg, tmp_path / "run")
    hook.after_step(StepContext(0, 0, 1, 2), 1.0, {})
    hook.end_of_epoch(StepContext(0, 1, 1, 2), None, {"train/loss": 1.0})
    assert not (tmp_path / "run").exists()
    remote = TrackingHook(cfg, None)
    remote.after_step(StepContext(0, 0, 0, 1), 1.0, {})
    remote.end_of_epoch(StepContext(0, 1, 0, 1), None, {"train/loss": 1.0})
    assert "remote storage: no TensorBoard files or steps.jsonl" in capsys.readouterr().out


def test_mlflow_missing_is_a_clear_error(tiny_dataset, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a)
    )
    cfg = _config(tiny_dataset, **{"train.mlflow_uri": "http://127.0.0.1:5000"})
    with pytest.raises(
        ConfigError, match=r"train.mlflow_uri='http://127.0.0.1:5000' needs MLflow.*pip install mlflow"
    ):
        TrackingHook(cfg, None)


def test_mlflow_run_gets_params_and_metrics(tiny_dataset, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the file store is deprecated, fine for a test
    uri = (tmp_path / "mlruns").as_uri()
    cfg = _config(tiny_dataset, **{"train.epochs": 1, "train.log_every": 10, "train.mlflow_uri": uri})
    out = _train(cfg, tiny_dataset, tmp_path / "run")
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("raydist").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.params["train.lr"] == str(cfg.train.lr)
    (rsum,) = client.get_metric_history(run.info.run_id, "val/rsum")
    assert (rsum.step, rsum.value) == (out["global_step"], pytest.approx(out["history"][0]["val/rsum"]))
    assert [m.step for m in client.get_metric_history(run.info.run_id, "step/loss")] == list(
        range(10, out["global_step"] + 1, 10)
    )
