"""``manifest.json``: the typed description of a dataset folder (splits, shards with sha256, vocab or
classes, source notes) and its strict reader/writer."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, Strict, TypeAdapter, ValidationError

from raydist.config import describe_errors
from raydist.data.schema import (
    FEATURE_TYPES,
    FORMAT_VERSION,
    IMAGE_FORMATS,
    MANIFEST_NAME,
    SPLITS,
    RaydistDataError,
)

_TASK_NAME = re.compile(r"[a-z][a-z0-9_-]*")
_Count = Annotated[int, Strict(), Field(ge=0)]
_Positive = Annotated[int, Strict(), Field(ge=1)]


def _inside_dataset(file: str) -> str:
    if Path(file).is_absolute() or ".." in Path(file).parts:
        raise ValueError(f"must be a path inside the dataset folder, got {file!r}")
    return file


def _task_name(task: str) -> str:
    """A task name's form (the data layer knows no task: which names are registered is checked above it, by
    :func:`raydist.tasks.build_task` and ``validate_dataset(tasks=...)``)."""
    if not _TASK_NAME.fullmatch(task):
        raise ValueError(f"expected a task name (lower-case letters, digits, '-' or '_'), got {task!r}")
    return task


def _feature_type(dtype: str) -> str:
    if dtype not in FEATURE_TYPES:
        raise ValueError(f"expected one of {list(FEATURE_TYPES)}, got {dtype!r}")
    return dtype


def _image_format(name: str) -> str:
    if name not in IMAGE_FORMATS:
        raise ValueError(f"expected one of {list(IMAGE_FORMATS)}, got {name!r}")
    return name


def _channels(n: int) -> int:
    if n not in (1, 3):
        raise ValueError(f"expected 1 (every image greyscale) or 3, got {n}")
    return n


def _height_width(size: list[int]) -> list[int]:
    if len(size) != 2:
        raise ValueError(f"expected [height, width], got {size}")
    return size


def _every_split(splits: dict[str, SplitInfo]) -> dict[str, SplitInfo]:
    missing, unknown = [s for s in SPLITS if s not in splits], sorted(set(splits) - set(SPLITS))
    problems = [
        f"{what} split(s) {names}" for what, names in (("missing", missing), ("unknown", unknown)) if names
    ]
    if problems:
        raise ValueError(f"{'; '.join(problems)}; expected {list(SPLITS)}")
    return {s: splits[s] for s in SPLITS}


@dataclass
class ShardInfo:
    """One Parquet shard: path relative to the dataset folder, row count, sha256 of the file bytes."""

    file: Annotated[str, AfterValidator(_inside_dataset)]
    rows: _Count
    sha256: str


@dataclass
class SplitInfo:
    """Rows (captions or samples), distinct images, and shards of one split."""

    rows: _Count
    images: _Count
    shards: list[ShardInfo]


@dataclass(kw_only=True)
class Manifest:
    """Contents of ``manifest.json``; the annotations are its schema (checked by ``manifest_from_dict``).

    ``image_format`` is ``features`` (float vectors of ``feature_dim`` × ``feature_dtype``; the default, so
    manifests written before the field existed read unchanged) or ``encoded`` (PNG/JPEG bytes; no
    ``feature_dim``, and ``image_channels`` -- 1 when every image is greyscale, else 3 -- and ``image_size``
    -- [height, width], the per-axis lower median over the train images -- describe the images).
    ``vocab`` is the vocab file name (task ``pairs``); ``num_classes`` is set for the other tasks, with
    ``class_names`` (optional) the original label of class 0, 1, … when a converter remapped the labels.
    ``standardization`` (optional, features only) names the file with the per-feature train mean and std
    that were applied to every split (``raydist.data.standardize``); datasets without it are unscaled.
    ``tokenizer`` (optional, pairs) names the subword ``tokenizer.json`` (``raydist.data.tokenizer``).
    ``source`` is free-form provenance (generator arguments, converter inputs ...).
    """

    task: Annotated[str, AfterValidator(_task_name)]
    feature_dim: _Positive | None = None
    splits: Annotated[dict[str, SplitInfo], AfterValidator(_every_split)]
    feature_dtype: Annotated[str, AfterValidator(_feature_type)] = "float32"
    image_format: Annotated[str, AfterValidator(_image_format)] = "features"
    image_channels: Annotated[_Positive, AfterValidator(_channels)] | None = None
    image_size: Annotated[list[_Positive], AfterValidator(_height_width)] | None = None
    vocab: str | None = None
    num_classes: _Positive | None = None
    class_names: list[str] | None = None
    standardization: Annotated[str, AfterValidator(_inside_dataset)] | None = None
    tokenizer: Annotated[str, AfterValidator(_inside_dataset)] | None = None
    source: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict in a stable key order."""
        out: dict[str, Any] = {"format_version": self.format_version, "task": self.task}
        if self.image_format == "features":
            out.update(feature_dim=self.feature_dim, feature_dtype=self.feature_dtype)
        else:
            out.update(
                image_format=self.image_format, image_channels=self.image_channels, image_size=self.image_size
            )
        if self.vocab is not None:
            out["vocab"] = self.vocab
        if self.num_classes is not None:
            out["num_classes"] = self.num_classes
        if self.class_names is not None:
            out["class_names"] = self.class_names
        if self.standardization is not None:
            out["standardization"] = self.standardization
        if self.tokenizer is not None:
            out["tokenizer"] = self.tokenizer
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


def manifest_or_load(dataset_dir: str | Path, manifest: Manifest | None) -> Manifest:
    """``manifest`` when the caller has read it already (a run plan reads a dataset's manifest once and hands
    it down), else the folder's (:func:`load_manifest`)."""
    return manifest if manifest is not None else load_manifest(dataset_dir)


def load_manifest(dataset_dir: str | Path) -> Manifest:
    """Read and check ``manifest.json``; every defect raises RaydistDataError naming file and field."""
    path = Path(dataset_dir) / MANIFEST_NAME
    if not path.is_file():
        raise RaydistDataError(
            f"{path}: missing; a dataset folder needs {MANIFEST_NAME} (is {dataset_dir} "
            "a raydist dataset? create one with `raydist make-data` or `raydist convert`)"
        )
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RaydistDataError(f"{path}: not valid JSON: {e}") from e
    return manifest_from_dict(raw, where=str(path))


_MANIFEST = TypeAdapter(Manifest)


def _image_fields_problem(manifest: Manifest) -> str | None:
    """The first field the image format needs and lacks, or has and must not have."""
    encoded = manifest.image_format == "encoded"
    if manifest.feature_dim is None and not encoded:
        return "field 'feature_dim': missing (image_format 'features' needs it)"
    if manifest.feature_dim is not None and encoded:
        return "field 'feature_dim': an 'encoded' dataset has no feature dim (expected absent or null)"
    for name in ("image_channels", "image_size"):
        if (getattr(manifest, name) is None) == encoded:
            need = (
                "missing (image_format 'encoded' needs it)" if encoded else "only an 'encoded' dataset has it"
            )
            return f"field '{name}': {need}"
    if manifest.standardization is not None and encoded:
        return "field 'standardization': only a dataset of feature vectors can be standardised"
    return None


def _class_names_problem(manifest: Manifest) -> str | None:
    """What is wrong with ``class_names``: one distinct name per class of ``num_classes``."""
    names = manifest.class_names
    if names is None:
        return None
    if manifest.num_classes is None:
        return "field 'class_names': only a dataset with num_classes has class names"
    if len(names) != manifest.num_classes or len(set(names)) != len(names):
        return (
            f"field 'class_names': expected {manifest.num_classes} distinct names (num_classes), got "
            f"{len(names)} with {len(set(names))} distinct"
        )
    return None


def manifest_from_dict(raw: Any, where: str = MANIFEST_NAME) -> Manifest:
    """Build a Manifest from parsed JSON: the format version first, then the schema of the fields, then
    the fields the image format needs (``feature_dim``; or ``image_channels`` and ``image_size``) and the
    field the task needs (``vocab`` for pairs, ``num_classes`` for the others)."""
    if not isinstance(raw, dict):
        raise RaydistDataError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    if "format_version" not in raw:
        raise RaydistDataError(f"{where}: field 'format_version': missing")
    version = raw["format_version"]
    if type(version) is not int or version != FORMAT_VERSION:
        raise RaydistDataError(
            f"{where}: field 'format_version': unknown version {version!r}; "
            f"this raydist reads {FORMAT_VERSION}"
        )
    try:
        manifest = _MANIFEST.validate_python(raw)
    except ValidationError as e:
        lines = describe_errors(e, label="field '{key}'")
        raise RaydistDataError("\n".join(f"{where}: {line}" for line in lines)) from e
    problem = _image_fields_problem(manifest) or _class_names_problem(manifest)
    if problem is not None:
        raise RaydistDataError(f"{where}: {problem}")
    needed = "vocab" if manifest.task == "pairs" else "num_classes"
    if getattr(manifest, needed) is None:
        raise RaydistDataError(f"{where}: field '{needed}': missing (task {manifest.task!r} needs it)")
    if needed == "vocab":
        return replace(manifest, num_classes=None, class_names=None)
    return replace(manifest, vocab=None, tokenizer=None)
