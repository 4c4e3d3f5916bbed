"""``manifest.json``: the typed description of a dataset folder (splits, shards with sha256, vocab or
classes, source notes) and its strict reader/writer."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydist.data.schema import FEATURE_TYPES, FORMAT_VERSION, MANIFEST_NAME, SPLITS, TASKS, RaydistDataError


@dataclass
class ShardInfo:
    """One Parquet shard: path relative to the dataset folder, row count, sha256 of the file bytes."""

    file: str
    rows: int
    sha256: str


@dataclass
class SplitInfo:
    """Rows (captions or samples), distinct images, and shards of one split."""

    rows: int
    images: int
    shards: list[ShardInfo]


@dataclass
class Manifest:
    """Contents of ``manifest.json``.

    ``vocab`` is the vocab file name (task ``pairs``); ``num_classes`` is set for task ``labels``.
    ``source`` is free-form provenance (generator arguments, converter inputs ...).
    """

    task: str
    feature_dim: int
    splits: dict[str, SplitInfo]
    feature_dtype: str = "float32"
    vocab: str | None = None
    num_classes: int | None = None
    source: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict in a stable key order."""
        out: dict[str, Any] = {
            "format_version": self.format_version,
            "task": self.task,
            "feature_dim": self.feature_dim,
            "feature_dtype": self.feature_dtype,
        }
        if self.vocab is not None:
            out["vocab"] = self.vocab
        if self.num_classes is not None:
            out["num_classes"] = self.num_classes
        out["splits"] = {
            name: {
                "rows": s.rows,
                "images": s.images,
                "shards": [{"file": sh.file, "rows": sh.rows, "sha256": sh.sha256} for sh in s.shards],
            }
            for name, s in self.splits.items()
        }
        out["source"] = self.source
        return out


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(dataset_dir: str | Path, manifest: Manifest) -> Path:
    """Write ``manifest.json`` (stable key order, indented) and return its path."""
    path = Path(dataset_dir) / MANIFEST_NAME
    path.write_text(json.dumps(manifest.to_dict(), indent=2) + "\n")
    return path


def load_manifest(dataset_dir: str | Path) -> Manifest:
    """Read and check ``manifest.json``; every defect raises RaydistDataError naming file and field."""
    path = Path(dataset_dir) / MANIFEST_NAME
    if not path.is_file():
        raise RaydistDataError(f"{path}: missing; a dataset folder needs {MANIFEST_NAME} (is {dataset_dir} "
                               "a raydist dataset? create one with `raydist make-data` or `raydist convert`)")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RaydistDataError(f"{path}: not valid JSON: {e}") from e
    return manifest_from_dict(raw, where=str(path))


def _get(obj: Any, key: str, typ: type | tuple[type, ...], where: str, label: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise RaydistDataError(f"{where}: field '{label}' is missing")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, typ):
        names = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise RaydistDataError(f"{where}: field '{label}': expected {names}, got {value!r}")
    return value


def manifest_from_dict(raw: Any, where: str = MANIFEST_NAME) -> Manifest:
    """Build a Manifest from parsed JSON, checking version, task, types and required fields."""
    if not isinstance(raw, dict):
        raise RaydistDataError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    version = _get(raw, "format_version", int, where, "format_version")
    if version != FORMAT_VERSION:
        raise RaydistDataError(
            f"{where}: field 'format_version': unknown version {version}; this raydist reads {FORMAT_VERSION}"
        )
    task = _get(raw, "task", str, where, "task")
    if task not in TASKS:  # a task registered by a user module (raydist.tasks.register_task)
        from raydist.tasks.base import task_names

        if task not in task_names():
            raise RaydistDataError(
                f"{where}: field 'task': unknown task {task!r}; expected one of {task_names()}"
            )
    dim = _get(raw, "feature_dim", int, where, "feature_dim")
    if dim < 1:
        raise RaydistDataError(f"{where}: field 'feature_dim': expected >= 1, got {dim}")
    dtype = raw.get("feature_dtype", "float32")
    if dtype not in FEATURE_TYPES:
        raise RaydistDataError(f"{where}: field 'feature_dtype': expected one of {list(FEATURE_TYPES)}, "
                               f"got {dtype!r}")
    vocab = num_classes = None
    if task == "pairs":
        vocab = _get(raw, "vocab", str, where, "vocab")
    else:
        num_classes = _get(raw, "num_classes", int, where, "num_classes")
        if num_classes < 1:
            raise RaydistDataError(f"{where}: field 'num_classes': expected >= 1, got {num_classes}")
    splits_raw = _get(raw, "splits", dict, where, "splits")
    splits = {}
    for name in SPLITS:
        s = _get(splits_raw, name, dict, where, f"splits.{name}")
        shards = []
        for i, sh in enumerate(_get(s, "shards", list, where, f"splits.{name}.shards")):
            label = f"splits.{name}.shards[{i}]"
            file = _get(sh, "file", str, where, f"{label}.file")
            if Path(file).is_absolute() or ".." in Path(file).parts:
                raise RaydistDataError(f"{where}: field '{label}.file': must be a path inside the dataset "
                                       f"folder, got {file!r}")
            shards.append(ShardInfo(file, _get(sh, "rows", int, where, f"{label}.rows"),
                                    _get(sh, "sha256", str, where, f"{label}.sha256")))
        splits[name] = SplitInfo(_get(s, "rows", int, where, f"splits.{name}.rows"),
                                 _get(s, "images", int, where, f"splits.{name}.images"), shards)
    extra = sorted(set(splits_raw) - set(SPLITS))
    if extra:
        raise RaydistDataError(f"{where}: field 'splits': unknown split(s) {extra}; expected {list(SPLITS)}")
    source = raw.get("source", {})
    if not isinstance(source, dict):
        raise RaydistDataError(f"{where}: field 'source': expected an object, got {source!r}")
    return Manifest(task=task, feature_dim=dim, splits=splits, feature_dtype=dtype, vocab=vocab,
                    num_classes=num_classes, source=source, format_version=version)
