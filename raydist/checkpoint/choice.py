"""Which checkpoint a path means: a checkpoint folder is itself, a run folder its best checkpoint by the run's val
metric (from the run's ``best_checkpoint.json``, else each checkpoint's own reported score) or its newest."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from raydist.checkpoint.io import find_checkpoint, local_folder, newest_checkpoint, run_checkpoints
from raydist.checkpoint.state_files import has_state, read_state
from raydist.runfiles import BEST_CHECKPOINT_FILE


@dataclass(frozen=True)
class ChosenCheckpoint:
    """A checkpoint folder and why it was chosen: the folder given, ``best by val/<metric> = …`` or ``latest``."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.path} ({self.reason})"


def record_best_checkpoint(run_dir: str | Path, best: str | Path, metric: str, value: float | None) -> Path:
    """Write the run folder's ``best_checkpoint.json``: the best checkpoint's folder name, the val metric that
    chose it and its value, and the run's newest checkpoint now (a newer one, from a resumed run, makes the
    record stale and :func:`choose_checkpoint` then scores the checkpoints itself)."""
    run_dir = Path(run_dir)
    newest = newest_checkpoint(run_dir)
    record = {
        "checkpoint": Path(best).name,
        "metric": metric,
        "value": value,
        "newest": newest.name if newest else None,
    }
    path = run_dir / BEST_CHECKPOINT_FILE
    path.write_text(json.dumps(record, indent=1))
    return path


def _recorded_best(run_dir: Path, newest: Path) -> ChosenCheckpoint | None:
    """The checkpoint ``best_checkpoint.json`` names, when the file exists, is current (its newest checkpoint
    is still the run's newest) and the folder it names is complete; else None."""
    path = run_dir / BEST_CHECKPOINT_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        name, metric, value, recorded_newest = (
            record[k] for k in ("checkpoint", "metric", "value", "newest")
        )
    except (OSError, json.JSONDecodeError, TypeError, KeyError) as e:
        raise ValueError(
            f"{path}: unreadable record of the best checkpoint ({e!r}); expected a JSON object with "
            "checkpoint, metric, value and newest: delete it to choose by the checkpoints' "
            "val metrics"
        ) from e
    if recorded_newest != newest.name or not has_state(run_dir / str(name)):
        return None
    shown = f" = {value:.4g}" if isinstance(value, (int, float)) else ""
    return ChosenCheckpoint(run_dir / str(name), f"best by {metric}{shown}")


def checkpoint_score(folder: str | Path, metric: str) -> float | None:
    """The val metric a checkpoint was reported with: the last epoch of the history it carries
    (``state["loop"]["history"]``) when that epoch ended at the checkpoint's step; None for a mid-epoch
    checkpoint or one without a history. Only the loop's state is read (no tensor of the model)."""
    loop = read_state(folder, "loop") or {}
    history = loop.get("history") or []
    if not history or history[-1].get("step") != loop.get("global_step"):
        return None
    value = history[-1].get(metric)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def choose_checkpoint(
    path: str | Path, val_metric: Callable[[Path], str], *, latest: bool = False
) -> ChosenCheckpoint:
    """The checkpoint a path means: a checkpoint folder is itself; a run folder means its best checkpoint
    (the one Ray Train picked by the run's val metric), or with ``latest`` its newest. The best is read from
    the run's ``best_checkpoint.json`` (written when a run finishes) or, when that is missing or stale, chosen
    by each checkpoint's own score of ``val_metric(newest checkpoint)`` (e.g. ``"val/rsum"``; asked only then;
    :func:`checkpoint_score`; ties go to the older); a run with no scored checkpoint gives its newest."""
    given = local_folder(path)  # a URI's local copy
    folder = find_checkpoint(given)  # a checkpoint folder, or the run folder's newest (clear errors if not)
    if folder == given:
        return ChosenCheckpoint(folder, "the checkpoint given")
    if latest:
        return ChosenCheckpoint(folder, "latest")
    run_dir = folder.parent
    recorded = _recorded_best(run_dir, folder)
    if recorded is not None:
        return recorded
    metric = val_metric(folder)
    scores = {c: checkpoint_score(c, metric) for c in run_checkpoints(run_dir)}
    scored = {c: v for c, v in scores.items() if v is not None}
    if not scored:
        return ChosenCheckpoint(folder, f"latest: no checkpoint has a {metric}")
    best = max(scored, key=lambda c: scored[c])  # the first (oldest) of equal scores
    return ChosenCheckpoint(best, f"best by {metric} = {scored[best]:.4g}")
