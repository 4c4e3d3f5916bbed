"""Ctrl-C / SIGTERM: the run stops at a step boundary with a checkpoint, says how to resume, exits 130; a
second signal quits at once; the resumed run loses and repeats no step. The same with two Ray Train workers, from
a terminal (SIGINT to the process group), runs once, on object storage: tests/test_object_storage_runs.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from raydist.checkpoint import has_state, load_checkpoint
from raydist.cli import main
from raydist.data import make_synthetic
from raydist.runfiles import STEPS_FILE
from raydist.train.stopping import stop_on_signals

EPOCHS = 2
STEPS = (80 * 5) // 32  # steps per epoch of `small_dataset` with the tiny preset's global batch of 32


def _epoch_of(step: int) -> int:
    """The 1-based epoch that global step ``step`` (1-based) belongs to."""
    return (step - 1) // STEPS + 1


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory):
    """400 train rows: 12 steps of 32 rows per epoch."""
    out = tmp_path_factory.mktemp("data") / "small"
    return make_synthetic(out, images=80, captions_per_image=5, dim=16, seed=1, val_images=24, test_images=24)


def _logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / STEPS_FILE
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def _wait_for_steps(
    run_dir: Path, steps: int, done: threading.Event | subprocess.Popen, timeout: float
) -> None:
    """Wait until ``steps.jsonl`` has ``steps`` lines, failing if the run ends or ``timeout`` passes first."""
    deadline = time.time() + timeout
    while len(_logged_steps(run_dir)) < steps:
        ended = done.is_set() if isinstance(done, threading.Event) else done.poll() is not None
        assert not ended, f"the run ended before logging {steps} steps"
        assert time.time() < deadline, f"no {steps} steps logged in {run_dir} within {timeout} s"
        time.sleep(0.01)


def _printed(text: str, label: str) -> str:
    lines = [line[len(label) :].strip() for line in text.splitlines() if line.startswith(label)]
    assert len(lines) == 1, f"expected one {label!r} line in:\n{text}"
    return lines[0]


def test_signals_write_the_stop_file_then_quit(tmp_path):
    stop_file = tmp_path / "run" / "stop-requested"
    stop_file.parent.mkdir()
    stop_file.touch()  # left by an earlier stopped attempt: must not stop this one
    before = signal.getsignal(signal.SIGINT)
    with stop_on_signals(stop_file) as signals:
        assert not stop_file.exists() and not signals.requested
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs on the main thread at its next bytecode
        assert stop_file.exists() and signals.count == 1
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    assert not stop_file.exists() and signal.getsignal(signal.SIGINT) is before
    with pytest.raises(KeyboardInterrupt), stop_on_signals(None):  # no stop file: the first signal quits
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)


def test_ctrl_c_in_process_checkpoints_the_step_and_the_same_name_resumes_exactly(
    small_dataset, tmp_path, capsys
):
    """``train.num_workers=0``: Ctrl-C mid-run, then the same command again (``--name`` of an unfinished run
    with the same config resumes); the final parameters equal an uninterrupted run's."""
    runs = tmp_path / "runs"

    def train(name: str, *extra: str) -> int:
        return main(
            [
                "train",
                "--preset",
                "tiny",
                "--data",
                str(small_dataset),
                "--storage",
                str(runs),
                "--name",
                name,
                "train.num_workers=0",
                f"train.epochs={EPOCHS}",
                "train.log_every=1",
                "train.seed=5",
                "train.tensorboard=false",
                *extra,
            ]
        )

    ended = threading.Event()

    def interrupt() -> None:
        _wait_for_steps(runs / "cut", 2, ended, timeout=120)
        os.kill(os.getpid(), signal.SIGINT)

    watcher = threading.Thread(target=interrupt, daemon=True)
    watcher.start()
    slow = "debug.step_delay_s=0.05"  # a run takes at least 1.2 s: the signal lands mid-run
    code = train("cut", slow)
    ended.set()
    watcher.join(5)
    out = capsys.readouterr().out
    assert code == 130, out
    checkpoint = Path(_printed(out, "checkpoint:"))
    assert checkpoint.parent == runs / "cut" and has_state(checkpoint)
    assert _printed(out, "resume with:") == f"raydist train --resume {checkpoint}"
    stopped_at = load_checkpoint(checkpoint)[0]["loop"]["global_step"]
    assert 2 <= stopped_at < EPOCHS * STEPS and _logged_steps(runs / "cut") == list(range(1, stopped_at + 1))
    assert (
        f"stopped on request at epoch {_epoch_of(stopped_at)}/{EPOCHS}, step {stopped_at}: checkpoint saved"
        in out
    )
    assert not (runs / "cut" / "stop-requested").exists()

    assert train("cut", slow, "loss.margin=0.5") == 2  # reusing the name with another config is refused
    assert "changed: loss.margin: 0.2 -> 0.5" in capsys.readouterr().err

    assert train("cut", slow) == 0
    out = capsys.readouterr().out
    assert f"resuming cut at epoch {_epoch_of(stopped_at)} (step {stopped_at})" in out
    assert _logged_steps(runs / "cut") == list(range(1, EPOCHS * STEPS + 1))  # no step lost or repeated
    assert train("cut", slow) == 2 and "is finished" in capsys.readouterr().err

    assert train("whole") == 0  # the same run, uninterrupted
    capsys.readouterr()
    resumed, whole = (load_checkpoint(runs / name)[0]["model"] for name in ("cut", "whole"))
    for key in whole:
        torch.testing.assert_close(resumed[key], whole[key], rtol=0, atol=1e-6, msg=key)
