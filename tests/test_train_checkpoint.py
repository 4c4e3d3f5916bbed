"""Checkpoint files: atomic writes, newest-complete lookup, clear errors for half-written folders."""

import time

import pytest
import torch

from raydist.checkpoint import STATE_FILE, find_checkpoint, load_checkpoint, save_checkpoint
from raydist.config import load_config


class Explodes:
    """Pickling this raises, as a crash in the middle of torch.save would."""

    def __reduce__(self):
        raise RuntimeError("disk full")


@pytest.fixture
def vocab_file(tmp_path):
    f = tmp_path / "vocab.json"
    f.write_text('{"words": ["<pad>", "<start>", "<end>", "<unk>"]}')
    return f


def test_round_trip(tmp_path, vocab_file):
    cfg = load_config("tiny", overrides={"loss.margin": 0.3})
    save_checkpoint(tmp_path / "run" / "checkpoint_a", {"w": torch.arange(3)}, cfg, files={"vocab.json": vocab_file})
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
    with pytest.raises(FileNotFoundError, match="no state.pt"):
        load_checkpoint(run / "checkpoint_2")


def test_truncated_state_file_is_a_clear_error(tmp_path, vocab_file):
    folder = save_checkpoint(tmp_path / "c", {"w": torch.ones(1000)}, load_config("tiny"), files={"vocab.json": vocab_file})
    data = (folder / STATE_FILE).read_bytes()
    (folder / STATE_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"state.pt: unreadable checkpoint state"):
        load_checkpoint(folder)
