"""One finished Tune trial as an experiment sees it (config, per-epoch history, best checkpoint, test
metrics), read from the sweep's experiment folder on local or remote storage, and saved as JSON."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raydist.checkpoint import has_state

TRIALS_FILE = "trials.json"


@dataclass
class TrialRecord:
    """A trial of one of an experiment's sweeps. ``config`` is the trial's full flat config (dotted keys);
    ``history`` its per-epoch reports (``epoch``, ``train/*``, ``val/*``); ``test`` the test-split metrics of
    its best checkpoint (by ``metric``, the sweep's validation metric)."""

    sweep: str
    trial: str
    status: str
    config: dict[str, Any]
    history: list[dict[str, Any]]
    metric: str
    best_epoch: int | None = None
    checkpoint: str | None = None
    test: dict[str, float] = field(default_factory=dict)
    error: str = ""

    def val(self, key: str) -> float:
        """``val/<key>`` at the best epoch (NaN when the trial never reported it)."""
        return _value(self.best_report(), f"val/{key}")

    def last(self, key: str) -> float:
        """``key`` in the last epoch's report (NaN when absent)."""
        return _value(self.history[-1] if self.history else {}, key)

    def curve(self, key: str) -> tuple[list[int], list[float]]:
        """(epochs, values) of ``key`` over the history (epochs without it left out)."""
        points = [(int(r["epoch"]), float(r[key])) for r in self.history if _finite(r.get(key))]
        return [e for e, _ in points], [v for _, v in points]

    def best_report(self) -> dict[str, Any]:
        """The history entry of the best epoch ({} when there is none)."""
        return next((r for r in self.history if r.get("epoch") == self.best_epoch), {})


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _value(report: dict[str, Any], key: str) -> float:
    value = report.get(key)
    return float(value) if _finite(value) else math.nan


def read_history(trial_path: str) -> list[dict[str, Any]]:
    """The per-epoch reports of a trial (its ``result.json``, one JSON object per report), local or remote;
    mid-epoch reports (no validation) are left out."""
    import pyarrow.fs

    fs, root = pyarrow.fs.FileSystem.from_uri(trial_path)
    try:
        with fs.open_input_stream(f"{root}/result.json") as f:
            lines = f.read().decode().splitlines()
    except FileNotFoundError:
        return []
    reports = [json.loads(line) for line in lines if line.strip()]
    by_epoch = {
        int(r["epoch"]): r
        for r in reports
        if "epoch" in r
        and any(k.startswith("val/") for k in r)
        and all(_finite(v) for k, v in r.items() if k.startswith("val/"))
    }
    return [_plain(by_epoch[e]) for e in sorted(by_epoch)]


def _plain(report: dict[str, Any]) -> dict[str, Any]:
    """A report without Tune's bookkeeping (config, ids, host, timestamps other than ``time_total_s``)."""
    drop = {
        "config",
        "date",
        "hostname",
        "node_ip",
        "pid",
        "trial_id",
        "timestamp",
        "done",
        "checkpoint_dir_name",
        "iterations_since_restore",
        "time_since_restore",
        "training_iteration",
    }
    return {k: v for k, v in report.items() if k not in drop}


def best_epoch(history: list[dict[str, Any]], metric: str, mode: str = "max") -> int | None:
    """The epoch of the best ``metric`` among the reports whose checkpoint still exists (Ray keeps the best
    ``train.keep_checkpoints``; of equal scores it may keep a later one), ties to the latest epoch."""
    scored = [
        (float(r[metric]), int(r["epoch"]))
        for r in history
        if _finite(r.get(metric)) and checkpoint_exists(r.get("checkpoint_path"))
    ]
    if not scored:
        return None
    sign = 1 if mode == "max" else -1
    return max(scored, key=lambda s: (sign * s[0], s[1]))[1]


def checkpoint_exists(path: str | None) -> bool:
    """Whether a checkpoint folder (local, or ``s3://`` …) still exists."""
    if not path:
        return False
    import pyarrow.fs

    fs, root = pyarrow.fs.FileSystem.from_uri(path)
    return fs.get_file_info(root).type != pyarrow.fs.FileType.NotFound


def local_checkpoint(path: str, cache: Path) -> Path:
    """A local folder with the checkpoint at ``path``: the folder itself, or a copy of a remote one
    (``s3://``, ``gs://``) under ``cache``."""
    if "://" not in path:
        return Path(path)
    import pyarrow.fs

    dest = cache / Path(path.rstrip("/")).name
    if not has_state(dest):
        dest.mkdir(parents=True, exist_ok=True)
        pyarrow.fs.copy_files(path, str(dest))
    return dest


def save_records(records: list[TrialRecord], path: Path) -> Path:
    """Write the records as JSON (re-read by :func:`load_records`)."""
    path.write_text(json.dumps([asdict(r) for r in records], indent=1, default=str))
    return path


def load_records(path: Path) -> list[TrialRecord]:
    """The records :func:`save_records` wrote."""
    return [TrialRecord(**r) for r in json.loads(Path(path).read_text())]
