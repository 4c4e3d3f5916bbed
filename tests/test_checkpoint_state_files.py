"""Checkpoints as data (raydist/checkpoint/state_files.py): the state round-trips exactly through safetensors +
JSON, a real run saves that way and resumes bit for bit as from an older pickle ``state.pt``; an older state.pt
loads as weights only, and a crafted one (a ``__reduce__`` payload that would create a marker file) runs nothing
in any loading path -- eval, index, train --resume, serve's loader, Embedder.from_checkpoint, an s3:// copy --
and is refused in one line naming the file; ``raydist checkpoint convert`` rewrites a trusted one."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from object_store import upload

from raydist.checkpoint import (
    STATE_FILE,
    UntrustedCheckpointError,
    load_checkpoint,
    read_state,
    save_checkpoint,
)
from raydist.checkpoint.names import LEGACY_STATE_FILE, TENSORS_FILE
from raydist.checkpoint.state_files import decode_state, encode_state
from raydist.cli import main
from raydist.config import load_config
from raydist.retrieval.embedder import Embedder
from raydist.serving.service import load_retriever
from raydist.tasks import DataInfo, build_task
from raydist.train.local import LocalRuntime
from raydist.train.loop import run_loop
from raydist.train.plan import step_plan


class Payload:
    """Unpickling this creates ``marker``: what a crafted checkpoint would do with ``weights_only=False``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _same(a, b) -> bool:
    """Exactly equal, types included (an OrderedDict is a dict; tensors by dtype, shape and values; NaN equal to
    NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def test_state_round_trips_exactly_through_tensors_and_json(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    shared = torch.arange(6.0)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),  # int keys, a tuple (betas), 0-d step tensors
        "tied": {"a": shared, "b": shared, "view": shared[2:4]},
        "half": torch.ones(2, dtype=torch.bfloat16),
        "empty": [torch.zeros(0), torch.zeros(0, 3)],
        "array": np.arange(5, dtype=np.uint32),
        "scalar": np.float64(0.25),
        "$odd": {"$tensor": "not a tag", "k": (1, None, "x", [2.5, -math.inf, math.nan])},
        "ids": {(1, 2): True, 3: False},
        "big": 2**70,
    }
    tree, tensors = encode_state(state)
    json.dumps(tree)  # JSON as it stands
    assert _same(decode_state(json.loads(json.dumps(tree)), tensors.__getitem__), state)
    folder = save_checkpoint(tmp_path / "c", state, load_config("tiny"))
    assert {p.name for p in folder.iterdir()} == {STATE_FILE, TENSORS_FILE, "config.yaml"}
    assert _same(read_state(folder), state) and _same(read_state(folder, "optimizer"), state["optimizer"])
    with pytest.raises(TypeError, match=r"checkpoint state model/x: a Payload is not data"):
        encode_state({"model": {"x": Payload(tmp_path / "m")}})


def _setup(data_dir, run_dir, epochs):
    cfg = load_config(
        "tiny", overrides={"data.path": str(data_dir), "train.num_workers": 0, "train.epochs": epochs}
    )
    task = build_task(cfg, DataInfo.from_dataset(data_dir))
    plan = step_plan(cfg, task.info.task)
    return cfg, task, plan, LocalRuntime(cfg, task, plan, run_dir)


def _as_pickle_checkpoint(folder: Path, dest: Path) -> Path:
    """``folder`` as an older raydist wrote it: the same state, RNG states as tuples, in a pickle state.pt."""
    shutil.copytree(folder, dest, ignore=shutil.ignore_patterns(STATE_FILE, TENSORS_FILE))
    state = read_state(folder)
    version, internal, gauss = state["rng"]["python"]
    numpy_rng = np.random.RandomState()
    numpy_state = state["rng"]["numpy"]
    numpy_rng.set_state(
        {
            **numpy_state,
            "state": {**numpy_state["state"], "key": np.asarray(numpy_state["state"]["key"], np.uint32)},
        }
    )
    rng = {
        "python": (version, tuple(internal), gauss),
        "numpy": numpy_rng.get_state(),
        "torch": state["rng"]["torch"],
    }
    torch.save({**state, "rng": rng}, dest / LEGACY_STATE_FILE)
    return dest


def test_a_run_saves_data_and_resumes_bit_for_bit_as_from_a_pickle_checkpoint(small_pairs, tmp_path):
    """Two epochs straight; one epoch then resumed from its (safetensors + JSON) checkpoint; and resumed from
    the same checkpoint written as the older pickle state.pt: the same weights, optimizer and RNG state, bit for
    bit."""
    cfg, task, plan, whole = _setup(small_pairs, tmp_path / "whole", 2)
    run_loop(cfg, task, whole, plan)
    cfg, task, plan, first = _setup(small_pairs, tmp_path / "first", 1)
    run_loop(cfg, task, first, plan)
    cut = first.checkpoints[-1]
    assert {p.name for p in cut.iterdir()} >= {STATE_FILE, TENSORS_FILE} and not (
        cut / LEGACY_STATE_FILE
    ).exists()
    ends = {}
    for name, start in (("data", cut), ("pickle", _as_pickle_checkpoint(cut, tmp_path / "old" / cut.name))):
        cfg, task, plan, again = _setup(small_pairs, tmp_path / name, 2)
        out = run_loop(cfg, task, again, plan, resume_from=str(start))
        assert out["resumed_at"] == [first.reports[-1]["step"]]
        ends[name] = load_checkpoint(again.checkpoints[-1])[0]
    want = load_checkpoint(whole.checkpoints[-1])[0]
    for got in ends.values():
        for part in ("model", "optimizer", "scheduler", "rng"):
            assert _same(got[part], want[part]), part
    assert list(ends["data"]) == list(ends["pickle"]) == list(want)
    assert all(_same(ends["data"][k], ends["pickle"][k]) for k in want if k != "loop")

    def timeless(state):  # the loop's history without its wall-clock figures
        return [{k: v for k, v in h.items() if not k.endswith("per_s")} for h in state["loop"]["history"]]

    assert _same(timeless(ends["data"]), timeless(want)) and _same(timeless(ends["pickle"]), timeless(want))


def _crafted(tmp_path: Path, dataset: Path) -> tuple[Path, Path]:
    """A run folder whose one checkpoint's state is a crafted pickle state.pt (config, task and vocab genuine),
    and the marker file its payload would create."""
    cfg = load_config("tiny", overrides={"data.path": str(dataset)})
    info = DataInfo.from_dataset(dataset)
    model = build_task(cfg, info).build_model()
    folder = save_checkpoint(
        tmp_path / "run" / "checkpoint_00000001",
        {"model": model.state_dict()},
        cfg,
        task=info.to_json(),
        files=info.files,
    )
    (folder / STATE_FILE).unlink()
    (folder / TENSORS_FILE).unlink()
    marker = tmp_path / "pwned"
    torch.save({"model": Payload(marker), "loop": {"history": []}}, folder / LEGACY_STATE_FILE)
    return folder, marker


def test_the_crafted_pickle_is_a_live_payload(small_pairs, tmp_path):
    folder, marker = _crafted(tmp_path, small_pairs)
    torch.load(folder / LEGACY_STATE_FILE, weights_only=False)  # what the old loader did
    assert marker.exists()


def _refused_line(text: str, folder: Path) -> None:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert f"{folder / LEGACY_STATE_FILE}: refused" in lines[0] and "raydist checkpoint convert" in lines[0]


@pytest.mark.parametrize(
    "command",
    [
        ["eval", "--checkpoint", "{run}"],
        ["eval", "--checkpoint", "{checkpoint}"],
        ["index", "--checkpoint", "{checkpoint}", "--split", "val", "--out", "{tmp}/index"],
        ["train", "--resume", "{checkpoint}", "train.num_workers=0"],
    ],
    ids=["eval-run", "eval-checkpoint", "index", "train-resume"],
)
def test_a_crafted_pickle_runs_nothing_on_the_command_line(small_pairs, tmp_path, capsys, command):
    folder, marker = _crafted(tmp_path, small_pairs)
    values = {"run": folder.parent, "checkpoint": folder, "tmp": tmp_path}
    assert main([word.format(**values) for word in command]) == 2
    assert not marker.exists()
    _refused_line(capsys.readouterr().err.removeprefix("raydist: error: "), folder)


def test_a_crafted_pickle_runs_nothing_in_the_library_loaders(small_pairs, tmp_path):
    folder, marker = _crafted(tmp_path, small_pairs)
    for load in (
        lambda: Embedder.from_checkpoint(folder.parent),
        lambda: Embedder.from_checkpoint(folder),
        lambda: load_retriever(folder, "val"),  # raydist serve's loader
        lambda: load_checkpoint(folder),
    ):
        with pytest.raises(UntrustedCheckpointError) as refused:
            load()
        _refused_line(str(refused.value), folder)
    assert not marker.exists()


def test_a_crafted_pickle_on_object_storage_runs_nothing(s3_server, small_pairs, tmp_path):
    folder, marker = _crafted(tmp_path, small_pairs)
    uri = upload(folder.parent, s3_server.create_bucket("crafted") + "/exp/run")
    for path in (uri, f"{uri}/{folder.name}"):
        with pytest.raises(UntrustedCheckpointError, match=rf"{LEGACY_STATE_FILE}: refused"):
            Embedder.from_checkpoint(path)
    assert not marker.exists()


def test_an_older_pickle_checkpoint_loads_as_weights_and_converts(small_pairs, tmp_path, capsys):
    """A genuine older state.pt (tensors, tuples, a NumPy RNG array) loads with weights_only; `raydist checkpoint
    convert` rewrites a run folder of them as data with the same state."""
    cfg = load_config("tiny", overrides={"data.path": str(small_pairs)})
    state = {
        "model": {"w": torch.arange(4.0)},
        "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        "loop": {"global_step": 3, "history": [{"step": 3, "val/rsum": 12.5}]},
    }
    old = tmp_path / "old" / "checkpoint_00000003"
    save_checkpoint(old, {}, cfg)
    for name in (STATE_FILE, TENSORS_FILE):
        (old / name).unlink()
    torch.save(state, old / LEGACY_STATE_FILE)
    assert _same(load_checkpoint(old)[0], state)
    assert main(["checkpoint", "convert", str(old.parent), str(tmp_path / "new")]) == 0
    new = tmp_path / "new" / old.name
    assert not (new / LEGACY_STATE_FILE).exists() and _same(read_state(new), state)
    assert "converted:" in capsys.readouterr().out
    assert main(["checkpoint", "convert", str(old.parent), str(tmp_path / "new")]) == 2  # never overwrites


@pytest.mark.parametrize(
    "damage, file, why",
    [
        (lambda f: (f / STATE_FILE).write_text('{"loop": {"$numpy": ["|O", 1]}}'), STATE_FILE, "is not data"),
        (lambda f: (f / STATE_FILE).write_text('{"loop": {"$pickle": "x"}}'), STATE_FILE, "unknown tag"),
        (
            lambda f: (f / STATE_FILE).write_text('{"w": {"$tensor": "nope"}}'),
            TENSORS_FILE,
            "no tensor 'nope'",
        ),
        (lambda f: (f / TENSORS_FILE).write_bytes(b"\x10"), TENSORS_FILE, "unreadable checkpoint tensors"),
        (lambda f: (f / TENSORS_FILE).unlink(), TENSORS_FILE, "unreadable checkpoint tensors"),
    ],
    ids=["object-dtype", "unknown-tag", "missing-tensor", "corrupt-tensors", "no-tensors"],
)
def test_a_damaged_state_is_one_error_naming_the_file(tmp_path, damage, file, why):
    folder = save_checkpoint(tmp_path / "c", {"w": torch.ones(3), "loop": {"step": 1}}, load_config("tiny"))
    damage(folder)
    with pytest.raises(ValueError, match=rf"{folder / file}: .*{why}"):
        load_checkpoint(folder)
