"""Checkpoint files: atomic writes, newest-complete lookup, clear errors for half-written folders."""

import os
import time

import pytest
import torch

from raydist.checkpoint import (
    STATE_FILE,
    find_checkpoint,
    load_checkpoint,
    newest_checkpoint,
    save_checkpoint,
)
from raydist.config import load_config
from raydist.tasks import DataInfo, build_task
from raydist.train.local import LocalRuntime
from raydist.train.plan import step_plan


class Explodes(dict):
    """Writing this raises, as a crash in the middle of writing the state would."""

    def items(self):
        raise RuntimeError("disk full")


@pytest.fixture
def vocab_file(tmp_path):
    f = tmp_path / "vocab.json"
    f.write_text('{"words": ["<pad>", "<start>", "<end>", "<unk>"]}')
    return f


def test_round_trip(tmp_path, vocab_file):
    cfg = load_config("tiny", overrides={"loss.margin": 0.3})
    save_checkpoint(
        tmp_path / "run" / "checkpoint_a", {"w": torch.arange(3)}, cfg, files={"vocab.json": vocab_file}
    )
    state, loaded, folder = load_checkpoint(tmp_path / "run")
    assert torch.equal(state["w"], torch.arange(3)) and loaded == cfg and folder.name == "checkpoint_a"


def test_crash_while_writing_leaves_no_loadable_half(tmp_path, vocab_file):
    cfg = load_config("tiny")
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoint_1", {"w": torch.ones(2)}, cfg, files={"vocab.json": vocab_file})
    time.sleep(0.01)
    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(run / "checkpoint_2", {"w": Explodes()}, cfg, files={"vocab.json": vocab_file})
    assert not (run / "checkpoint_2" / STATE_FILE).exists()
    assert find_checkpoint(run).name == "checkpoint_1"  # the half-written one is never picked
    with pytest.raises(FileNotFoundError, match=f"no {STATE_FILE}"):
        load_checkpoint(run / "checkpoint_2")


def test_truncated_state_file_is_a_clear_error(tmp_path, vocab_file):
    folder = save_checkpoint(
        tmp_path / "c", {"w": torch.ones(1000)}, load_config("tiny"), files={"vocab.json": vocab_file}
    )
    data = (folder / STATE_FILE).read_bytes()
    (folder / STATE_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{STATE_FILE}: unreadable checkpoint state"):
        load_checkpoint(folder)


@pytest.mark.parametrize(
    "names",
    [
        [
            "checkpoint_00000009",
            "checkpoint_00000010",
            "checkpoint_00000120",
        ],  # LocalRuntime: the global step
        [
            "checkpoint_2026-11-30_09-59-59.999999",
            "checkpoint_2026-11-30_10-00-00.000001",
            "checkpoint_2026-12-01_08-00-00.500000",
        ],  # Ray Train: the time of the report
    ],
)
def test_newest_is_the_last_name_whatever_the_mtimes(tmp_path, vocab_file, labels_dataset, names):
    """Folders written in name order but touched in reverse (a copy or a sync resets mtimes): the newest is
    the last name, for find_checkpoint and for LocalRuntime's restart alike; a half-written folder is skipped."""
    cfg = load_config("tiny", overrides={"data.path": str(labels_dataset)})
    run = tmp_path / "run"
    for age, name in enumerate(names):
        folder = save_checkpoint(run / name, {"w": torch.ones(1)}, cfg, files={"vocab.json": vocab_file})
        os.utime(folder, (1e9 - age * 1e3, 1e9 - age * 1e3))  # the last written is the oldest by mtime
    (run / "checkpoint_99999999").mkdir()  # sorts last, but has no state
    assert newest_checkpoint(run) == run / names[-1] and find_checkpoint(run) == run / names[-1]
    task = build_task(cfg, DataInfo.from_dataset(labels_dataset))
    runtime = LocalRuntime(cfg, task, step_plan(cfg, task.info.task), run)
    assert runtime.checkpoint_to_restore() == (str(run / names[-1]),) * 2
    assert newest_checkpoint(tmp_path / "empty") is None
