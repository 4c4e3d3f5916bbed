"""Faults: a worker that dies mid-epoch, exact resume, resume by path and of a named run."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from raydist.checkpoint import has_state, load_checkpoint
from raydist.config import ConfigError, load_config
from raydist.train.trainer import run_training


def tiny(tiny_dataset, tmp_path, **overrides):
    base = {"data.path": str(tiny_dataset), "train.storage_path": str(tmp_path), "train.epochs": 2}
    return load_config("tiny", overrides={**base, **overrides})


def final_params(outcome) -> dict[str, torch.Tensor]:
    state, _, _ = load_checkpoint(outcome.latest_checkpoint)
    return state["model"]


def steps_per_epoch(outcome) -> int:
    return outcome.history[0]["step"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_injected_fault_restarts_from_checkpoint_and_matches_uninterrupted(
    ray_cluster, small_pairs, tmp_path
):
    """A 1-worker Ray Train run that fails mid-epoch and restarts ends with the parameters of an uninterrupted
    run; the uninterrupted run is trained in process (``train.num_workers=0``: the same loop, rank 0 of 1,
    without Ray, and one torch thread as the Ray Train worker has), so this also holds the in-process runtime to
    the Ray Train one: bit for bit. On 400 rows (12 steps per epoch): the claim holds on any data."""
    common = {"train.checkpoint_every": 4, "train.seed": 11}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a Ray worker of one logical CPU runs one torch thread; the sums' order follows
    try:
        clean = run_training(
            tiny(small_pairs, tmp_path / "a", **common, **{"train.num_workers": 0}), evaluate_test=False
        )
    finally:
        torch.set_num_threads(threads)
    fail_at = steps_per_epoch(clean) + 3  # mid second epoch
    faulty = run_training(
        tiny(
            small_pairs,
            tmp_path / "b",
            **common,
            **{"train.num_workers": 1, "debug.fail_at_step": fail_at, "train.max_failures": 1},
        ),
        evaluate_test=False,
    )
    resumed = faulty.resumed_at
    assert len(resumed) == 1, resumed
    assert fail_at - 4 <= resumed[0] <= fail_at  # at most one checkpoint interval redone
    assert [m["epoch"] for m in faulty.history] == [1, 2]
    assert faulty.history[-1]["step"] == clean.history[-1]["step"]
    a, b = final_params(clean), final_params(faulty)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_worker_killed_from_outside_run_completes(ray_cluster, small_pairs, tmp_path):
    """SIGKILL to the Train workers once a checkpoint is registered: the run restarts from it and ends with every
    epoch and step. On 400 rows (12 steps per epoch, a checkpoint every 3): the claim holds on any data, and the
    restart is not waiting on 2000 rows' checkpoints."""
    import psutil

    cfg = tiny(
        small_pairs, tmp_path, **{"train.checkpoint_every": 3, "train.max_failures": 2, "train.epochs": 3}
    )
    killed: list[int] = []
    waited: list[str] = []

    def live_train_workers() -> list[psutil.Process]:
        """This session's Ray Train worker processes, found by the process title Ray gives an actor
        ("ray::RayTrainWorker..."), among this process's descendants: no dashboard needed."""
        found = []
        for proc in psutil.Process().children(recursive=True):
            try:
                title = " ".join(proc.cmdline())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if title.startswith("ray::RayTrainWorker"):
                found.append(proc)
        return found

    def registered_checkpoint() -> Path | None:
        """The checkpoint Ray Train's controller has registered: the latest one named in its checkpoint manager
        snapshot (written once the checkpoint folder is persisted), with our state in it."""
        for snapshot in Path(tmp_path).glob("*/checkpoint_manager_snapshot.json"):
            try:
                latest = json.loads(snapshot.read_text()).get("latest_checkpoint_result")
            except (OSError, ValueError):  # being written: look again
                continue
            if latest and has_state(snapshot.parent / latest["checkpoint_dir_name"]):
                return snapshot.parent / latest["checkpoint_dir_name"]
        return None

    def killer():
        timeout = 120
        deadline = time.time() + timeout
        while time.time() < deadline:
            if registered_checkpoint() is not None:
                for proc in live_train_workers():
                    os.kill(proc.pid, signal.SIGKILL)
                    killed.append(proc.pid)
                    return
            time.sleep(0.2)
        waited.append(
            f"no checkpoint registered in {tmp_path}/*/checkpoint_manager_snapshot.json "
            f"(with its checkpoint's state) and no live RayTrainWorker to kill within {timeout} s"
        )

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    outcome = run_training(cfg, evaluate_test=False)
    thread.join(1)
    assert killed, waited[0] if waited else "no worker was killed before the run ended"
    assert len(outcome.resumed_at) >= 1 and outcome.resumed_at[0] > 0
    assert [m["epoch"] for m in outcome.history] == [1, 2, 3]
    assert outcome.history[-1]["step"] == 3 * outcome.history[0]["step"]  # no step lost or repeated
    assert outcome.best_metrics is not None and outcome.best_metrics["val/rsum"] > 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_resume_by_path_and_by_run_name(ray_cluster, small_pairs, tmp_path):
    # the claim is about which run and checkpoint resume (decided before any worker starts), not the worker
    # group or the data: the runs train in process, on 400 rows
    one = {"train.num_workers": 0}
    first = run_training(
        tiny(small_pairs, tmp_path, **one, **{"train.epochs": 1, "train.run_name": "same"}),
        evaluate_test=False,
    )
    longer = tiny(small_pairs, tmp_path, **one, **{"train.epochs": 2, "train.run_name": "same"})
    with pytest.raises(ConfigError, match="is finished"):  # the name alone never extends a finished run
        run_training(longer, evaluate_test=False)
    again = run_training(longer, resume_from=first.run_dir, evaluate_test=False)  # --resume RUN continues it
    assert again.run_dir == first.run_dir
    assert [m["epoch"] for m in again.history] == [1, 2]
    assert again.resumed_at == [first.history[-1]["step"]]
    by_path = run_training(
        tiny(small_pairs, tmp_path, **one, **{"train.epochs": 2}),
        resume_from=first.latest_checkpoint,
        evaluate_test=False,
    )
    assert by_path.resumed_at == [first.history[-1]["step"]]
    assert [m["epoch"] for m in by_path.history] == [1, 2]
