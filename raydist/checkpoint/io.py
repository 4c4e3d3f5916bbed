"""Checkpoint folders: the state (model, optimizer, scheduler, counters, RNG states, history, the state of every
registered component) as ``state.safetensors`` + ``state.json`` (:mod:`raydist.checkpoint.state_files`: data,
never a pickle), ``config.yaml``, ``task.json`` and the task's extra files (``vocab.json``).

Files are written to temporary names and renamed, and ``state.json`` is written last, so a crash while
writing never leaves a folder that loads half.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from raydist.checkpoint.names import CHECKPOINT_GLOB, CONFIG_FILE, STATE_FILE, TASK_FILE
from raydist.checkpoint.remote import fetch_run_or_checkpoint
from raydist.checkpoint.state_files import has_state, read_state, write_state
from raydist.config import Config, ConfigError, apply_overrides, from_saved, validate
from raydist.data.remote import local_dataset
from raydist.data.schema import MANIFEST_NAME
from raydist.plugins import PluginError
from raydist.uris import is_uri

SHOWN_PARAMETERS = 3  # differing parameters a refusal names


def _atomic_write_bytes(path: Path, write: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch CPU RNG states: Python's and NumPy's as plain lists and numbers (JSON), torch's
    a uint8 tensor."""
    version, internal, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=False)
    numpy_state["state"]["key"] = numpy_state["state"]["key"].tolist()
    return {"python": [version, list(internal), gauss], "numpy": numpy_state, "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured (or an older checkpoint's tuples)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    if isinstance(numpy_state, dict):
        key = np.asarray(numpy_state["state"]["key"], dtype=np.uint32)
        numpy_state = {**numpy_state, "state": {**numpy_state["state"], "key": key}}
    np.random.set_state(numpy_state)
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    folder: str | Path,
    state: dict[str, Any],
    cfg: Config,
    *,
    task: dict[str, Any] | None = None,
    files: dict[str, Path] | None = None,
) -> Path:
    """Write a checkpoint folder: ``files`` (name → source, e.g. the vocab), ``task.json`` (the task's name
    and data facts), ``config.yaml``, then the state (:func:`raydist.checkpoint.state_files.write_state`:
    ``state.json`` last), each file via a temporary name."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, src in (files or {}).items():
        shutil.copyfile(src, folder / (name + ".tmp"))
        os.replace(folder / (name + ".tmp"), folder / name)
    if task is not None:
        task_text = json.dumps(task, indent=1).encode()
        _atomic_write_bytes(folder / TASK_FILE, lambda f: f.write(task_text))
    text = yaml.safe_dump(cfg.to_dict(), sort_keys=False).encode()
    _atomic_write_bytes(folder / CONFIG_FILE, lambda f: f.write(text))
    write_state(folder, state)
    return folder


def run_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete checkpoint folders (those with ``state.json``, or an older one's ``state.pt``) of a run
    folder, oldest first.

    Order is by name, never by mtime (a copy or a sync changes mtimes): Ray Train names its folders
    ``checkpoint_<YYYY-mm-dd_HH-MM-SS.ffffff>`` (the time of the report) and :class:`raydist.train.local.
    LocalRuntime` names them ``checkpoint_<global step, 8 digits>``; both sort by name in the order written."""
    return sorted(p for p in Path(run_dir).glob(CHECKPOINT_GLOB) if has_state(p))


def newest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder in a run folder (the last of :func:`run_checkpoints`), None when
    there is none."""
    found = run_checkpoints(run_dir)
    return found[-1] if found else None


def local_folder(path: str | Path) -> Path:
    """A checkpoint or run folder as a local path: a URI's up-to-date local copy
    (:func:`raydist.checkpoint.remote.fetch_run_or_checkpoint`), a local path made absolute."""
    if is_uri(path):
        return fetch_run_or_checkpoint(str(path))
    return Path(path).expanduser().resolve()


def find_checkpoint(path: str | Path) -> Path:
    """Resolve a checkpoint folder, or a run folder's :func:`newest_checkpoint` (either may be a URI:
    :func:`local_folder`)."""
    path = local_folder(path)
    if has_state(path):
        return path
    if not path.exists():
        raise FileNotFoundError(f"checkpoint path {path} does not exist")
    newest = newest_checkpoint(path)
    if newest is None:
        raise FileNotFoundError(
            f"{path} is neither a checkpoint folder (no {STATE_FILE}) nor a run folder with checkpoints"
        )
    return newest


def read_config(folder: Path) -> Config:
    """``config.yaml`` of a checkpoint folder."""
    try:
        return from_saved(yaml.safe_load((folder / CONFIG_FILE).read_text()))
    except (OSError, yaml.YAMLError, ConfigError, PluginError) as e:
        raise ValueError(f"{folder / CONFIG_FILE}: unreadable checkpoint config: {e}") from e


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], Config, Path]:
    """Load ``(state, config, folder)`` from a checkpoint or run folder (the state read as data:
    :func:`raydist.checkpoint.state_files.read_state`, the one reader of checkpoint state)."""
    folder = find_checkpoint(path)
    cfg = read_config(folder)
    return read_state(folder), cfg, folder


def config_changes(saved: Config, current: Config) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (saved value, current value)}`` for every key whose value differs."""
    before, after = saved.flat(), current.flat()
    return {k: (before.get(k), after[k]) for k in after if before.get(k) != after[k]}


def state_differences(saved: dict[str, torch.Tensor], built: dict[str, torch.Tensor]) -> list[str]:
    """One line per tensor whose name or shape differs between a saved state dict and a built model's,
    in the saved order (names only the built model has come last): ``name: checkpoint=[…] run=[…]``."""

    def shape(state: dict[str, torch.Tensor], name: str) -> str:
        return str(list(state[name].shape)) if name in state else "missing"

    names = [*saved, *(n for n in built if n not in saved)]
    return [
        f"{n}: checkpoint={shape(saved, n)} run={shape(built, n)}"
        for n in names
        if n not in saved or n not in built or saved[n].shape != built[n].shape
    ]


def model_on_meta(build: Callable[[Config], nn.Module], cfg: Config) -> dict[str, torch.Tensor]:
    """The state dict (names and shapes, no storage) of the model ``build(cfg)`` makes on the meta device."""
    with torch.device("meta"):
        return build(cfg).state_dict()


def check_model_fits(
    saved_model: dict[str, torch.Tensor],
    saved_cfg: Config,
    cfg: Config,
    build: Callable[[Config], nn.Module],
    *,
    saved_from: str,
) -> None:
    """Refuse a config whose model (``build(cfg)``, on the meta device) does not have the saved model's
    tensor names and shapes. The ConfigError names the config keys to blame, each a key whose change alone
    (applied to ``saved_cfg``) already breaks the fit, or every differing key when no single one does,
    and the first differing tensors."""
    problems = state_differences(saved_model, model_on_meta(build, cfg))
    if not problems:
        return
    changes = config_changes(saved_cfg, cfg)

    def breaks_alone(key: str) -> bool:
        try:
            alone = apply_overrides(saved_cfg, {key: changes[key][1]})
            validate(alone)
            return bool(state_differences(saved_model, model_on_meta(build, alone)))
        except ConfigError:
            return True

    blamed = [k for k in changes if breaks_alone(k)] or list(changes)
    lines = [f"{k}: checkpoint={changes[k][0]!r} run={changes[k][1]!r}" for k in blamed]
    more = len(problems) - SHOWN_PARAMETERS
    lines += problems[:SHOWN_PARAMETERS] + ([f"... and {more} more tensors"] if more > 0 else [])
    head = (
        f"cannot change {', '.join(blamed)} when resuming from {saved_from}: the model this config builds"
        if blamed
        else f"checkpoint {saved_from}: the model its own config builds"
    )
    raise ConfigError(head + " does not fit the saved one\n  " + "\n  ".join(lines))


def load_task_info(folder: str | Path) -> dict[str, Any]:
    """``task.json`` of a checkpoint folder (task name and data facts)."""
    path = Path(folder) / TASK_FILE
    if not path.is_file():
        raise ValueError(
            f"{folder}: no {TASK_FILE} (a checkpoint from an older raydist): retrain to evaluate it"
        )
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable checkpoint task file: {e}") from e


def resumed_config(checkpoint: str | Path, overrides: dict[str, Any]) -> tuple[Config, list[str]]:
    """The config a resumed run uses: the checkpoint's own, with ``overrides`` applied. Returns the config
    and one ``key: old -> new`` line per changed key. Whether the saved model still fits is checked from the
    state itself before training starts (:func:`raydist.retrieval.trained.resume_checkpoint`)."""
    saved = read_config(find_checkpoint(checkpoint))
    cfg = apply_overrides(saved, overrides)
    validate(cfg)
    return cfg, change_lines(saved, cfg)


def change_lines(saved: Config, current: Config) -> list[str]:
    """One ``key: old -> new`` line per key whose value differs (:func:`config_changes`)."""
    return [f"{k}: {old!r} -> {new!r}" for k, (old, new) in config_changes(saved, current).items()]


def format_changes(lines: list[str]) -> str:
    """``changed: a: 1 -> 2, b: ...`` (or ``changed: nothing``): how a resumed run reports :func:`change_lines`."""
    return f"changed: {', '.join(lines) if lines else 'nothing'}"


def recorded_dataset(checkpoint: str | Path, data_dir: str | Path | None = None) -> Path:
    """``data_dir`` (a URI or a WebDataset folder: its local dataset, :func:`raydist.data.remote.local_dataset`),
    else the dataset folder the checkpoint was trained on, when it still exists."""
    folder = find_checkpoint(checkpoint)
    if data_dir is not None and (is_uri(data_dir) or not (Path(data_dir) / MANIFEST_NAME).exists()):
        data_dir = local_dataset(data_dir)
    data_dir = data_dir or load_task_info(folder).get("data_dir")
    if not data_dir or not Path(data_dir).is_dir():
        raise ConfigError(
            f"checkpoint {folder} records no dataset that still exists ({data_dir}); give --data DIR"
        )
    return Path(data_dir)
