"""Checkpoint folders: ``state.pt`` (model, optimizer, scheduler, counters, RNG states, history, the state
of every registered component), ``config.yaml``, ``task.json`` and the task's extra files (``vocab.json``).

Files are written to temporary names and renamed, and ``state.pt`` is written last, so a crash while
writing never leaves a folder that loads half.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from raydist.config import Config, ConfigError, apply_overrides, from_dict, validate

STATE_FILE = "state.pt"
CONFIG_FILE = "config.yaml"
TASK_FILE = "task.json"

# Config keys that change the shape of the saved model or the meaning of its vocabulary: a checkpoint
# whose values differ cannot be loaded into the current run.
ARCHITECTURE_KEYS = (
    "model.embed_dim", "model.word_dim", "model.num_layers", "model.no_imgnorm", "model.mlp_hidden",
)  # fmt: skip


def _atomic_write_bytes(path: Path, write: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch CPU RNG states."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
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
    and data facts), ``config.yaml``, then ``state.pt`` last, each file via a temporary name."""
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
    _atomic_write_bytes(folder / STATE_FILE, lambda f: torch.save(state, f))
    return folder


def find_checkpoint(path: str | Path) -> Path:
    """Resolve a checkpoint folder, or the newest ``checkpoint_*`` folder inside a run folder."""
    path = Path(path).expanduser().resolve()
    if (path / STATE_FILE).is_file():
        return path
    candidates = sorted(
        (p for p in path.glob("checkpoint_*") if (p / STATE_FILE).is_file()),
        key=lambda p: p.stat().st_mtime,
    )
    if not path.exists():
        raise FileNotFoundError(f"checkpoint path {path} does not exist")
    if not candidates:
        raise FileNotFoundError(
            f"{path} is neither a checkpoint folder (no {STATE_FILE}) nor a run folder with checkpoints"
        )
    return candidates[-1]


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], Config, Path]:
    """Load ``(state, config, folder)`` from a checkpoint or run folder."""
    folder = find_checkpoint(path)
    try:
        cfg = from_dict(yaml.safe_load((folder / CONFIG_FILE).read_text()))
    except (OSError, yaml.YAMLError, ConfigError) as e:
        raise ValueError(f"{folder / CONFIG_FILE}: unreadable checkpoint config: {e}") from e
    try:
        state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises several types for truncated/corrupt files
        raise ValueError(f"{folder / STATE_FILE}: unreadable checkpoint state: {e}") from e
    return state, cfg, folder


def check_compatible(saved: Config, current: Config, *, saved_from: str) -> None:
    """Refuse to resume when architecture keys differ; list every differing key."""
    a, b = saved.flat(), current.flat()
    diff = [f"{k}: checkpoint={a[k]!r} run={b[k]!r}" for k in ARCHITECTURE_KEYS if a[k] != b[k]]
    if diff:
        raise ConfigError(f"checkpoint {saved_from} is incompatible with this config:\n  " + "\n  ".join(diff))


def load_task_info(folder: str | Path) -> dict[str, Any]:
    """``task.json`` of a checkpoint folder (task name and data facts)."""
    path = Path(folder) / TASK_FILE
    if not path.is_file():
        raise ValueError(f"{folder}: no {TASK_FILE} (a checkpoint from an older raydist): retrain to evaluate it")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable checkpoint task file: {e}") from e


def resumed_config(checkpoint: str | Path, overrides: dict[str, Any]) -> tuple[Config, list[str]]:
    """The config a resumed run uses: the checkpoint's own, with ``overrides`` applied; overrides of keys
    that shape the saved model (:data:`ARCHITECTURE_KEYS`) are refused. Returns the config and one
    ``key: old -> new`` line per changed key."""
    _, saved, folder = load_checkpoint(checkpoint)
    fixed = sorted(set(overrides) & set(ARCHITECTURE_KEYS))
    if fixed:
        raise ConfigError(
            f"cannot change {', '.join(fixed)} when resuming from {folder}: they shape the saved model"
        )
    cfg = apply_overrides(saved, overrides)
    validate(cfg)
    before, after = saved.flat(), cfg.flat()
    return cfg, [f"{k}: {before[k]!r} -> {after[k]!r}" for k in after if before[k] != after[k]]


def recorded_dataset(checkpoint: str | Path, data_dir: str | Path | None = None) -> Path:
    """``data_dir``, else the dataset folder the checkpoint was trained on, when it still exists."""
    folder = find_checkpoint(checkpoint)
    data_dir = data_dir or load_task_info(folder).get("data_dir")
    if not data_dir or not Path(data_dir).is_dir():
        raise ConfigError(f"checkpoint {folder} records no dataset that still exists ({data_dir}); give --data DIR")
    return Path(data_dir)
