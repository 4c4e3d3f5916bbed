"""Writing and reading Parquet shards: ``write_split``, the staged :class:`DatasetWriter`, ``read_split``,
``split_files`` (for ``ray.data.read_parquet``) and ``split_arrays`` (for evaluation).

Rows of one image must be consecutive within a split (the writer refuses otherwise, validation checks
it); the writer also never splits an image's rows across two shards. Encoded images (PNG/JPEG bytes) are
written one row per image, each decoded in full before its shard is written.
"""

from __future__ import annotations

import itertools
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raydist.data.image_bytes import ImageInfo, dataset_channels, median_size
from raydist.data.manifest import (
    Manifest,
    ShardInfo,
    SplitInfo,
    manifest_or_load,
    sha256_file,
    write_manifest,
)
from raydist.data.schema import (
    CAPTION,
    CAPTIONS,
    CLEAN_LABEL,
    DEFAULT_ROWS_PER_SHARD,
    IMAGE,
    IMAGE_ID,
    LABEL,
    MANIFEST_NAME,
    SAMPLE_ID,
    SHARD_PATTERN,
    SPLITS,
    VOCAB_NAME,
    RaydistDataError,
    arrow_schema,
)
from raydist.data.standardize import STANDARDIZATION_NAME, FeatureStandardization, write_standardization
from raydist.data.validate import (
    Problem,
    SampleIdTracker,
    SplitTracker,
    decode_problems,
    split_problems,
    table_problems,
)
from raydist.data.vocab import Vocab
from raydist.data.webdataset import read_shard

PROBLEMS_SHOWN = 20  # a refused write lists this many problems one by one, then a count of the rest


class WriteRefused(RaydistDataError):
    """A write found problems in its input: every one of them (``problems``; the message lists the first
    :data:`PROBLEMS_SHOWN`), all found in one pass so a user fixes them in one go."""

    def __init__(self, what: str, problems: list[str]) -> None:
        self.what, self.problems = what, problems
        if len(problems) == 1:
            text = f"{what}: {problems[0]}"
        else:
            more = len(problems) - PROBLEMS_SHOWN
            text = f"{what}: {len(problems)} problems:\n  " + "\n  ".join(problems[:PROBLEMS_SHOWN])
            text += f"\n  ... and {more} more" if more > 0 else ""
        super().__init__(text)


def _named(problem: Problem, sources: Sequence[str] | None) -> str:
    """A problem of a row that came from a file (a converter's image) names that file first: the shard it
    was about to be written to is a staging file the user never sees."""
    if sources is None or problem.row is None:
        return str(problem)
    return f"{sources[problem.row]}: {problem.message}"


def _shard_bounds(image_ids: np.ndarray, rows_per_shard: int) -> list[int]:
    """Row offsets ``[0, …, N]`` cutting shards of at least ``rows_per_shard`` rows at image boundaries."""
    n = len(image_ids)
    starts = np.flatnonzero(np.r_[True, image_ids[1:] != image_ids[:-1]]) if n else np.zeros(0, np.int64)
    bounds = [0]
    while bounds[-1] < n:
        j = int(np.searchsorted(starts, bounds[-1] + rows_per_shard))
        bounds.append(int(starts[j]) if j < len(starts) else n)
    return bounds


def _column(values: Any, n: int, name: str) -> np.ndarray | None:
    if values is None:
        return None
    arr = np.asarray(values)
    if arr.shape != (n,):
        raise RaydistDataError(f"column '{name}': expected {n} values (one per row), got shape {arr.shape}")
    return arr


def _caption_array(captions: Sequence[str] | Sequence[Sequence[str]], typ: pa.DataType) -> pa.Array:
    """One shard's captions as an Arrow ``typ`` array (string, or list<string> for encoded images)."""
    if pa.types.is_list(typ):
        row = next((r for r, c in enumerate(captions) if isinstance(c, (str, bytes))), None)
        if row is not None:
            raise RaydistDataError(
                f"captions: row {row} is a string; each row of encoded images holds the "
                "list of the image's captions"
            )
    try:
        return pa.array(list(captions), typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise RaydistDataError(f"captions: expected {typ} per row: {e}") from e


def write_split(
    out_dir: str | Path,
    split: str,
    image_ids: np.ndarray,
    sample_ids: np.ndarray,
    features: np.ndarray | Sequence[bytes],
    captions: Sequence[str] | Sequence[Sequence[str]] | None,
    labels: np.ndarray | None = None,
    clean_labels: np.ndarray | None = None,
    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
    *,
    feature_index: np.ndarray | None = None,
    num_classes: int | None = None,
    image_infos: list[ImageInfo] | None = None,
    image_sources: Sequence[str] | None = None,
) -> list[ShardInfo]:
    """Write one split as ``out_dir/split/part-NNNNN.parquet`` and return the shard list.

    One row per caption (``captions`` given: task ``pairs``) or per sample (``labels`` given).
    Row r's feature vector is ``features[r]``, or ``features[feature_index[r]]`` when ``feature_index``
    is given (so an image's vector is stored once in memory however many captions it has).
    Features are written as float16 when ``features`` is float16, else float32.

    ``features`` that is not a numpy array is encoded images (image format ``encoded``): a sequence of PNG or
    JPEG file bytes (e.g. :class:`raydist.data.image_bytes.ImageFiles`, read one shard at a time), stored as
    they are in a binary ``image`` column; every row is one image, and task ``pairs`` rows hold the list of
    the image's captions (``captions[r]``: a list of strings). Each image is decoded in full before its shard
    is written; ``image_infos`` receives what each decode found, and ``image_sources`` (per row: where the
    image came from) is named in a refusal (:class:`WriteRefused`, which lists every problem of the split).

    Rows of one image must be consecutive; every shard is checked (ids, finite features or decodable images,
    non-empty captions, label range) before it is written, and a failed call removes the shards it wrote.
    """
    if split not in SPLITS:
        raise RaydistDataError(f"unknown split {split!r}; expected one of {SPLITS}")
    if rows_per_shard < 1:
        raise RaydistDataError(f"rows_per_shard must be >= 1, got {rows_per_shard}")
    if captions is None and labels is None:
        raise RaydistDataError("write_split needs captions (task 'pairs') or labels (task 'labels')")
    task = "pairs" if captions is not None else "labels"
    image_ids = np.asarray(image_ids)
    n = len(image_ids)
    columns = {
        IMAGE_ID: image_ids.astype(np.int64),
        SAMPLE_ID: _column(sample_ids, n, SAMPLE_ID).astype(np.int64),
        LABEL: _column(labels, n, LABEL),
        CLEAN_LABEL: _column(clean_labels, n, CLEAN_LABEL),
    }
    encoded = not isinstance(features, np.ndarray)
    caption_column = CAPTIONS if encoded else CAPTION
    if captions is not None and len(captions) != n:
        raise RaydistDataError(
            f"column '{caption_column}': expected {n} captions (one per row), got {len(captions)}"
        )
    if not encoded and features.ndim != 2:
        raise RaydistDataError(f"features must be a 2-D array [rows, dim], got shape {features.shape}")
    index = _column(feature_index, n, "feature_index")
    if index is None and len(features) != n:
        raise RaydistDataError(f"features has {len(features)} rows but there are {n} rows of ids")
    if index is not None and n and (index.min() < 0 or index.max() >= len(features)):
        raise RaydistDataError(f"feature_index outside [0, {len(features)})")
    if n == 0:
        raise RaydistDataError(f"split {split!r} has no rows")
    dim = None if encoded else features.shape[1]
    dtype = "float16" if not encoded and features.dtype == np.float16 else "float32"
    schema = arrow_schema(
        task,
        dim,
        feature_dtype=dtype,
        captions=captions is not None,
        labels=labels is not None,
        clean_labels=clean_labels is not None,
    )
    image_format = "encoded" if encoded else "features"
    split_dir = Path(out_dir) / split
    split_dir.mkdir(parents=True, exist_ok=True)
    if any(split_dir.glob("part-*.parquet")):
        raise RaydistDataError(f"{split_dir} already holds shards; write each split into a fresh folder")
    tracker, sample_tracker, written = SplitTracker(task, one_row_per_image=encoded), SampleIdTracker(), []
    found: list[str] = []
    bounds = _shard_bounds(image_ids, rows_per_shard)
    try:
        for k, (a, b) in enumerate(itertools.pairwise(bounds)):
            rows = index[a:b] if index is not None else slice(a, b)
            data = {name: pa.array(col[a:b], pa.int64()) for name, col in columns.items() if col is not None}
            if encoded:
                positions = index[a:b] if index is not None else range(a, b)
                data[IMAGE] = pa.array([features[int(r)] for r in positions], pa.binary())
            else:
                feats = np.ascontiguousarray(
                    features[rows], dtype=np.float16 if dtype == "float16" else np.float32
                )
                data[IMAGE] = pa.FixedSizeListArray.from_arrays(pa.array(feats.reshape(-1)), dim)
            if captions is not None:
                data[caption_column] = _caption_array(captions[a:b], schema.field(caption_column).type)
            table = pa.table({f.name: data[f.name] for f in schema}, schema=schema)
            file = f"{split}/{SHARD_PATTERN.format(index=k)}"
            problems = table_problems(
                table,
                file,
                task=task,
                feature_dim=dim,
                feature_dtype=dtype,
                num_classes=num_classes,
                expected_rows=None,
                image_format=image_format,
            )
            if encoded:
                problems += decode_problems(table, file, infos=image_infos, shown=PROBLEMS_SHOWN)
            problems += tracker.add(table, file)
            sample_tracker.add(table, file)
            problems += tracker.finish() if b == n else []
            problems += sample_tracker.finish() if b == n else []
            found += [_named(p, None if image_sources is None else image_sources[a:b]) for p in problems]
            if found:  # nothing more is written, but the rest is still checked: every problem in one pass
                continue
            path = Path(out_dir) / file
            pq.write_table(table, path)
            written.append(ShardInfo(file, table.num_rows, sha256_file(path)))
        if found:
            raise WriteRefused(f"refusing to write split {split!r}", found)
    except BaseException:
        for shard in written:
            (Path(out_dir) / shard.file).unlink(missing_ok=True)
        raise
    return written


@final
class DatasetWriter:
    """Builds a dataset in a hidden staging folder next to ``out_dir``; :meth:`commit` writes the vocab and
    ``manifest.json`` and renames the folder into place, so readers never see half a dataset.

    Use as a context manager: set ``writer.vocab`` (task ``pairs``), optionally ``writer.class_names`` and
    ``writer.standardization`` (statistics already applied to the features), and call :meth:`add_split` for
    train, val and test -- all with feature matrices or all with encoded images; leaving the block normally commits,
    an exception discards the staging folder. ``overwrite=True`` replaces an existing dataset (a folder holding ``manifest.json``) but never
    a non-empty folder that is not a dataset.
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        task: str = "pairs",
        num_classes: int | None = None,
        rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
        source: dict[str, Any] | None = None,
        overwrite: bool = False,
        all_problems: bool = False,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.all_problems = (
            all_problems  # a refused split is kept for commit() (converters: every problem at once)
        )
        self.task, self.num_classes, self.rows_per_shard = task, num_classes, rows_per_shard
        self.source = dict(source or {})
        self.overwrite = overwrite
        self.vocab: Vocab | None = None
        self.class_names: list[str] | None = None
        self.standardization: FeatureStandardization | None = None
        self.splits: dict[str, SplitInfo] = {}
        self.feature_dim: int | None = None
        self.feature_dtype: str | None = None
        self.image_format: str | None = None
        self.image_infos: dict[str, list[ImageInfo]] = {}  # encoded images: per split, what each decode found
        self.refusals: list[str] = []  # problems of the splits refused so far (see add_split)
        if task == "labels" and num_classes is None:
            raise RaydistDataError("task 'labels' needs num_classes")
        self._check_target()
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.staging = (
            self.out_dir.parent / f".{self.out_dir.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        self.staging.mkdir()

    def _check_target(self) -> None:
        out = self.out_dir
        if not out.exists() or (out.is_dir() and not any(out.iterdir())):
            return
        if not self.overwrite:
            raise RaydistDataError(
                f"{out} already exists and is not empty; choose another folder or "
                "overwrite=True (--overwrite) to replace a dataset"
            )
        if not (out / MANIFEST_NAME).is_file():
            raise RaydistDataError(
                f"{out} is not empty and holds no {MANIFEST_NAME}; refusing to replace a "
                "folder that is not a raydist dataset"
            )

    def add_split(
        self,
        split: str,
        image_ids: np.ndarray,
        sample_ids: np.ndarray,
        features: np.ndarray | Sequence[bytes],
        captions: Sequence[str] | Sequence[Sequence[str]] | None = None,
        labels: np.ndarray | None = None,
        clean_labels: np.ndarray | None = None,
        *,
        feature_index: np.ndarray | None = None,
        image_sources: Sequence[str] | None = None,
    ) -> SplitInfo | None:
        """Write one split (arguments as :func:`write_split`); the image format, and feature dim and dtype,
        must match across splits. A split whose rows have problems raises :class:`WriteRefused`; with
        ``all_problems`` it is not written (None) and the next splits are still checked: :meth:`commit` then
        refuses the whole dataset, naming every problem of every split."""
        if split in self.splits:
            raise RaydistDataError(f"split {split!r} was already written")
        if (captions is None) != (self.task == "labels"):
            raise RaydistDataError(
                f"task {self.task!r}: captions must be {'absent' if self.task == 'labels' else 'given'}"
            )
        image_format = "features" if isinstance(features, np.ndarray) else "encoded"
        if self.image_format not in (None, image_format):
            raise RaydistDataError(
                f"split {split!r}: images are {image_format} but earlier splits are {self.image_format}"
            )
        if image_format == "features":
            dtype = "float16" if features.dtype == np.float16 else "float32"
            if self.feature_dim is not None and (features.shape[-1], dtype) != (
                self.feature_dim,
                self.feature_dtype,
            ):
                raise RaydistDataError(
                    f"split {split!r}: features are {dtype}[{features.shape[-1]}] but earlier "
                    f"splits are {self.feature_dtype}[{self.feature_dim}]"
                )
        infos: list[ImageInfo] = []
        try:
            shards = write_split(
                self.staging,
                split,
                image_ids,
                sample_ids,
                features,
                captions,
                labels,
                clean_labels,
                self.rows_per_shard,
                feature_index=feature_index,
                num_classes=self.num_classes,
                image_infos=infos,
                image_sources=image_sources,
            )
        except WriteRefused as e:
            if not self.all_problems:
                raise
            # the next splits are still checked: commit() refuses with every problem
            self.refusals += [f"split {split!r}: {p}" for p in e.problems]
            return None
        self.image_format = image_format
        if image_format == "features":
            self.feature_dim, self.feature_dtype = features.shape[-1], dtype
        else:
            self.image_infos[split] = infos
        info = SplitInfo(sum(s.rows for s in shards), len(np.unique(np.asarray(image_ids))), shards)
        self.splits[split] = info
        return info

    def commit(self) -> Manifest:
        """Write vocab + manifest, then atomically move the staging folder to ``out_dir``."""
        if self.refusals:
            raise WriteRefused(f"refusing to write {self.out_dir}", self.refusals)
        missing = [s for s in SPLITS if s not in self.splits]
        if missing:
            raise RaydistDataError(f"cannot commit {self.out_dir}: split(s) {missing} were not written")
        if self.task == "pairs":
            if self.vocab is None:
                raise RaydistDataError(f"cannot commit {self.out_dir}: task 'pairs' needs a vocab")
            self.vocab.save(self.staging / VOCAB_NAME)
        if self.standardization is not None:
            if self.standardization.feature_dim != self.feature_dim:
                raise RaydistDataError(
                    f"cannot commit {self.out_dir}: standardisation of "
                    f"{self.standardization.feature_dim} features, but features have "
                    f"{self.feature_dim}"
                )
            write_standardization(self.staging, self.standardization)
        image_fields: dict[str, Any] = {"feature_dim": self.feature_dim, "feature_dtype": self.feature_dtype}
        if self.image_format == "encoded":
            image_fields = {
                "image_format": "encoded",
                "image_channels": dataset_channels(i for infos in self.image_infos.values() for i in infos),
                "image_size": median_size(self.image_infos["train"]),
            }
        manifest = Manifest(
            task=self.task,
            splits=self.splits,
            vocab=VOCAB_NAME if self.task == "pairs" else None,
            num_classes=self.num_classes,
            class_names=self.class_names,
            standardization=STANDARDIZATION_NAME if self.standardization is not None else None,
            source=self.source,
            **image_fields,
        )
        write_manifest(self.staging, manifest)
        self._check_target()
        trash = None
        if self.out_dir.exists():
            trash = self.staging.with_name(self.staging.name.replace(".partial-", ".old-"))
            os.rename(self.out_dir, trash)
        os.rename(self.staging, self.out_dir)
        if trash is not None:
            shutil.rmtree(trash)
        return manifest

    def abort(self) -> None:
        """Discard the staging folder."""
        shutil.rmtree(self.staging, ignore_errors=True)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            try:
                self.commit()
            except BaseException:
                self.abort()
                raise
        else:
            self.abort()


def split_files(path: str | Path, split: str, *, manifest: Manifest | None = None) -> list[str]:
    """Absolute paths of a split's shards in manifest order (input for ``ray.data.read_parquet``); ``manifest``:
    the folder's, when read already."""
    manifest = manifest_or_load(path, manifest)
    _known(split, manifest)
    root = Path(path).resolve()
    return [str(root / s.file) for s in manifest.splits[split].shards]


def _known(split: str, manifest: Manifest) -> None:
    if split not in manifest.splits:
        raise RaydistDataError(f"unknown split {split!r}; expected one of {list(manifest.splits)}")


def read_split(
    path: str | Path, split: str, verify: bool = True, *, manifest: Manifest | None = None
) -> pa.Table:
    """One split as a single Arrow table with ``image`` as float32 (encoded images: binary) and ``caption``
    as string (``captions`` as list<string>).

    ``verify=True`` checks sha256, schema, dims and values of every shard (see validate.py), decoding every
    encoded image, and raises RaydistDataError on the first problem. ``manifest``: the folder's, when read
    already.
    """
    path = Path(path)
    manifest = manifest_or_load(path, manifest)
    _known(split, manifest)
    tables: list[pa.Table] = []
    if verify:
        problems = split_problems(path, manifest, split, tables=tables)
        if problems:
            raise RaydistDataError(f"{path}: {problems[0]}")
    else:
        for shard in manifest.splits[split].shards:
            try:
                tables.append(read_shard(path / shard.file))
            except (pa.ArrowException, OSError) as e:
                raise RaydistDataError(f"{path / shard.file}: cannot read shard: {e}") from e
    types = {
        IMAGE: pa.binary()
        if manifest.image_format == "encoded"
        else pa.list_(pa.float32(), manifest.feature_dim),
        CAPTION: pa.string(),
        CAPTIONS: pa.list_(pa.string()),
    }
    out = []
    for t in tables:
        for name, typ in types.items():
            if name in t.column_names:
                t = t.set_column(t.schema.get_field_index(name), name, t.column(name).cast(typ))
        out.append(t)
    try:
        return pa.concat_tables(out)
    except pa.ArrowInvalid as e:
        raise RaydistDataError(f"{path}: shards of split {split!r} have different schemas: {e}") from e


def feature_matrix(column: pa.Array | pa.ChunkedArray | np.ndarray) -> np.ndarray:
    """An ``image`` column as float32 ``[N, D]``: from Arrow ``fixed_size_list`` (flattened without a
    per-row loop) or from the object array of per-row vectors that Ray Data numpy batches hold."""
    if isinstance(column, np.ndarray):
        if column.dtype == object:
            return np.stack(column).astype(np.float32, copy=False)
        return column.astype(np.float32, copy=False)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    dim = column.type.list_size
    values = column.flatten().to_numpy(zero_copy_only=False)
    return values.reshape(len(column), dim).astype(np.float32, copy=False)


def split_arrays(
    path: str | Path, split: str, verify: bool = True, *, manifest: Manifest | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """``(image_ids int64 [N], sample_ids int64 [N], features float32 [N, D], captions [N])`` of a split."""
    table = read_split(path, split, verify=verify, manifest=manifest)
    if table.schema.field(IMAGE).type == pa.binary():
        raise RaydistDataError(
            f"{path}: split {split!r} holds encoded images, not feature vectors (read_split gives its table)"
        )
    if CAPTION not in table.column_names:
        raise RaydistDataError(f"{path}: split {split!r} has no caption column (task 'labels')")
    return (
        table.column(IMAGE_ID).to_numpy(),
        table.column(SAMPLE_ID).to_numpy(),
        feature_matrix(table.column(IMAGE)),
        table.column(CAPTION).to_pylist(),
    )
