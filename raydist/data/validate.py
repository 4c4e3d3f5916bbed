"""Dataset validation: every check of the dataset layout (README.md#data) as a :class:`Problem` naming
file, row and field.

The same checks guard the writer (before a shard is written) and ``read_split(verify=True)``; encoded
images are decoded in full with Pillow (``validate_dataset(image_sample=N)`` decodes N per split).
Row numbers are 0-based positions within the named Parquet file.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raydist.data.image_bytes import ImageInfo, check_image
from raydist.data.manifest import Manifest, ShardInfo, manifest_or_load, sha256_file
from raydist.data.schema import (
    CAPTION,
    CAPTIONS,
    CLEAN_LABEL,
    FEATURE_TYPES,
    IMAGE,
    IMAGE_ID,
    LABEL,
    MANIFEST_NAME,
    SAMPLE_ID,
    SPLITS,
    RaydistDataError,
    column_type_problem,
    required_columns,
)
from raydist.data.standardize import load_standardization
from raydist.data.tokenizer import SubwordTokenizer
from raydist.data.vocab import Vocab
from raydist.data.webdataset import decode_sample_problems, is_tar_shard, read_shard

ROWS_SHOWN = 5  # per file and check: rows reported one by one before a "... and N more" summary


@dataclass
class Problem:
    """One defect: the file it is in, the row (0-based, within that file) and field where there is one."""

    file: str
    field: str | None
    message: str
    row: int | None = None

    def __str__(self) -> str:
        where = [self.file]
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.field is not None:
            where.append(f"field '{self.field}'")
        return ": ".join(where) + ": " + self.message


def _row_problems(
    file: str, field_name: str, bad_rows: np.ndarray, sample_ids: np.ndarray | None, message: str
) -> list[Problem]:
    """One Problem per bad row (the first ROWS_SHOWN), then a count of the rest."""
    out = []
    for r in bad_rows[:ROWS_SHOWN]:
        sid = f" (sample_id {int(sample_ids[r])})" if sample_ids is not None else ""
        out.append(Problem(file, field_name, message + sid, int(r)))
    if len(bad_rows) > ROWS_SHOWN:
        out.append(Problem(file, field_name, f"... and {len(bad_rows) - ROWS_SHOWN} more rows: {message}"))
    return out


def open_shard(
    dataset_dir: Path, shard: ShardInfo, *, verify_hash: bool = True
) -> tuple[pa.Table | None, list[Problem]]:
    """Read one shard; problems: file missing, sha256 mismatch, not a readable Parquet file (or WebDataset tar:
    :func:`raydist.data.webdataset.read_shard`)."""
    path = dataset_dir / shard.file
    if not path.is_file():
        return None, [Problem(shard.file, "file", f"shard listed in {MANIFEST_NAME} is missing ({path})")]
    problems = []
    if verify_hash:
        digest = sha256_file(path)
        if digest != shard.sha256:
            problems.append(
                Problem(
                    shard.file,
                    "sha256",
                    f"file hashes to {digest} but {MANIFEST_NAME} "
                    f"expects {shard.sha256} (file changed, truncated or replaced)",
                )
            )
    try:
        table = read_shard(path)
    except RaydistDataError as e:  # a tar shard's sample that is not usable, named by its key
        problems.append(Problem(shard.file, None, str(e).removeprefix(f"{path}: ")))
        return None, problems
    except (pa.ArrowException, OSError) as e:
        problems.append(Problem(shard.file, None, f"not a readable Parquet file (truncated or corrupt): {e}"))
        return None, problems
    return table, problems


def table_problems(
    table: pa.Table,
    file: str,
    *,
    task: str,
    feature_dim: int | None,
    feature_dtype: str,
    num_classes: int | None,
    expected_rows: int | None,
    image_format: str = "features",
) -> list[Problem]:
    """Schema, dims, nulls, finite features or non-empty image bytes, non-empty captions, label range and
    row count of one shard (decoding encoded images is :func:`decode_problems`)."""
    problems = []
    if expected_rows is not None and table.num_rows != expected_rows:
        problems.append(
            Problem(file, "rows", f"file has {table.num_rows} rows but {MANIFEST_NAME} says {expected_rows}")
        )
    for name in required_columns(task, image_format):
        if name not in table.column_names:
            problems.append(
                Problem(file, name, f"required column missing (task {task!r}, image_format {image_format!r})")
            )
    usable = set()
    for name, typ in zip(table.column_names, table.schema.types, strict=False):
        why = column_type_problem(name, typ, feature_dim, image_format)
        if (
            why is None
            and name == IMAGE
            and image_format == "features"
            and typ.value_type != FEATURE_TYPES[feature_dtype]
        ):
            why = f"values are {typ.value_type} but {MANIFEST_NAME} says feature_dtype {feature_dtype}"
        if why is not None:
            problems.append(Problem(file, name, why))
            continue
        nulls = np.flatnonzero(table.column(name).is_null().to_numpy(zero_copy_only=False))
        if len(nulls) and name not in (CAPTION, CAPTIONS):
            problems.extend(_row_problems(file, name, nulls, None, "null value"))
        else:
            usable.add(name)
    sample_ids = table.column(SAMPLE_ID).to_numpy() if SAMPLE_ID in usable else None
    if IMAGE in usable and table.num_rows and image_format == "features":
        values = table.column(IMAGE).combine_chunks().flatten().to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(~np.isfinite(values.reshape(table.num_rows, feature_dim)).all(axis=1))
        problems.extend(_row_problems(file, IMAGE, bad, sample_ids, "feature vector contains NaN or inf"))
    if IMAGE in usable and image_format == "encoded":
        empty = pc.equal(pc.binary_length(table.column(IMAGE)), 0).to_numpy(zero_copy_only=False)
        problems.extend(
            _row_problems(file, IMAGE, np.flatnonzero(empty), sample_ids, "zero-size image (0 bytes)")
        )
    if CAPTIONS in usable:
        captions = table.column(CAPTIONS).combine_chunks()
        none = pc.fill_null(pc.equal(pc.list_value_length(captions), 0), True).to_numpy(zero_copy_only=False)
        problems.extend(
            _row_problems(
                file, CAPTIONS, np.flatnonzero(none), sample_ids, "no captions (an empty or null list)"
            )
        )
        flat = pc.utf8_trim_whitespace(pc.list_flatten(captions))
        blank = pc.fill_null(pc.equal(pc.utf8_length(flat), 0), True).to_numpy(zero_copy_only=False)
        rows = np.unique(pc.list_parent_indices(captions).to_numpy()[blank])
        problems.extend(
            _row_problems(file, CAPTIONS, rows, sample_ids, "a caption is empty, whitespace-only or null")
        )
    if CAPTION in usable:
        stripped = pc.utf8_trim_whitespace(table.column(CAPTION))
        empty = pc.fill_null(pc.equal(pc.utf8_length(stripped), 0), True).to_numpy(zero_copy_only=False)
        problems.extend(
            _row_problems(
                file, CAPTION, np.flatnonzero(empty), sample_ids, "caption is empty, whitespace-only or null"
            )
        )
    for name in (LABEL, CLEAN_LABEL):
        if name in usable:
            labels = table.column(name).to_numpy()
            high = num_classes if num_classes is not None else np.iinfo(np.int64).max
            bad = np.flatnonzero((labels < 0) | (labels >= high))
            rng = f"[0, {num_classes})" if num_classes is not None else ">= 0"
            problems.extend(_row_problems(file, name, bad, sample_ids, f"label outside {rng}"))
    return problems


def decode_problems(
    table: pa.Table,
    file: str,
    rows: np.ndarray | None = None,
    *,
    infos: list[ImageInfo] | None = None,
    shown: int = ROWS_SHOWN,
) -> list[Problem]:
    """Decode the ``image`` bytes of ``rows`` (default: every row) in full with Pillow
    (:func:`raydist.data.image_bytes.check_image`): one Problem per image that is not a complete PNG or JPEG,
    saying why (truncated, corrupt, unsupported format). Null and zero-size images are
    :func:`table_problems`' to report and are skipped; so is a shard whose ``image`` is not binary. The
    :class:`ImageInfo` of each good image is appended to ``infos``; ``shown`` bad rows are named one by one,
    the rest counted."""
    if IMAGE not in table.column_names or table.schema.field(IMAGE).type not in (
        pa.binary(),
        pa.large_binary(),
    ):
        return []
    column = table.column(IMAGE)
    sample_ids = table.column(SAMPLE_ID) if SAMPLE_ID in table.column_names else None
    problems, bad = [], 0
    for r in range(table.num_rows) if rows is None else rows[rows < table.num_rows]:
        data = column[int(r)].as_py()
        if not data:
            continue
        try:
            info = check_image(data)
        except RaydistDataError as e:
            bad += 1
            if bad <= shown:
                sid = f" (sample_id {sample_ids[int(r)].as_py()})" if sample_ids is not None else ""
                problems.append(Problem(file, IMAGE, f"{e}{sid}", int(r)))
            continue
        if infos is not None:
            infos.append(info)
    if bad > shown:
        problems.append(Problem(file, IMAGE, f"... and {bad - shown} more rows: image does not decode"))
    return problems


def caption_ok(table: pa.Table) -> np.ndarray:
    """Per row: the caption is present and not whitespace-only (all True without a caption column)."""
    if CAPTION not in table.column_names:
        return np.ones(table.num_rows, dtype=bool)
    length = pc.utf8_length(pc.utf8_trim_whitespace(table.column(CAPTION)))
    return pc.fill_null(pc.greater(length, 0), False).to_numpy(zero_copy_only=False)


class SplitTracker:
    """Checks that span the shards of one split: rows of an image consecutive (with ``one_row_per_image``, as
    in an encoded dataset: one row), every image with a caption (task ``pairs``), distinct image count."""

    def __init__(self, task: str, *, one_row_per_image: bool = False) -> None:
        self.task = task
        self.one_row_per_image = one_row_per_image
        self.images: set[int] = set()
        self._open: tuple[int, bool, str, int] | None = None  # last image run: id, has caption, file, row

    def add(self, table: pa.Table, file: str) -> list[Problem]:
        """Feed the next shard (in manifest order); returns the problems it reveals."""
        if table.num_rows == 0 or IMAGE_ID not in table.column_names or table.column(IMAGE_ID).null_count:
            return []
        ids = table.column(IMAGE_ID).to_numpy()
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        has_caption = np.logical_or.reduceat(caption_ok(table), starts)
        problems = []
        if self.one_row_per_image:
            again = np.flatnonzero(ids[1:] == ids[:-1]) + 1
            if self._open is not None and self._open[0] == ids[0]:
                again = np.r_[0, again]
            problems.extend(
                _row_problems(
                    file,
                    IMAGE_ID,
                    again,
                    None,
                    "image_id of the previous row again; an encoded dataset stores each image in one row",
                )
            )
        first = 0
        if self._open is not None and self._open[0] == ids[0]:
            self._open = (self._open[0], self._open[1] or bool(has_caption[0]), self._open[2], self._open[3])
            first = 1
        for j in range(first, len(starts)):
            problems.extend(self._close())
            image, row = int(ids[starts[j]]), int(starts[j])
            if image in self.images:
                problems.append(
                    Problem(
                        file,
                        IMAGE_ID,
                        f"image_id {image} appears again after rows of other "
                        "images; the rows of one image must be consecutive within a split",
                        row,
                    )
                )
            self.images.add(image)
            self._open = (image, bool(has_caption[j]), file, row)
        return problems

    def _close(self) -> list[Problem]:
        if self._open is None or self.task != "pairs" or self._open[1]:
            return []
        image, _, file, row = self._open
        return [
            Problem(
                file,
                CAPTION,
                f"image_id {image} has no captions (every caption row of the image is empty or null)",
                row,
            )
        ]

    def finish(self) -> list[Problem]:
        """Problems of the last image once all shards were added."""
        problems = self._close()
        self._open = None
        return problems


class SampleIdTracker:
    """Duplicate ``sample_id`` over any number of shards (a split or the whole dataset)."""

    def __init__(self) -> None:
        self._parts: list[tuple[str, np.ndarray]] = []

    def add(self, table: pa.Table, file: str) -> None:
        """Remember the shard's sample ids."""
        if SAMPLE_ID in table.column_names and not table.column(SAMPLE_ID).null_count:
            self._parts.append((file, table.column(SAMPLE_ID).to_numpy()))

    def finish(self) -> list[Problem]:
        """One Problem per repeated sample_id (the first ROWS_SHOWN), at its second occurrence."""
        if not self._parts:
            return []
        ids = np.concatenate([ids for _, ids in self._parts])
        order = np.argsort(ids, kind="stable")
        repeat = order[1:][ids[order][1:] == ids[order][:-1]]  # positions of second+ occurrences
        if not len(repeat):
            return []
        offsets = np.cumsum([0] + [len(p) for _, p in self._parts])
        problems = []
        for pos in np.sort(repeat)[:ROWS_SHOWN]:
            part = int(np.searchsorted(offsets, pos, side="right")) - 1
            first = int(np.flatnonzero(ids == ids[pos])[0])
            first_part = int(np.searchsorted(offsets, first, side="right")) - 1
            problems.append(
                Problem(
                    self._parts[part][0],
                    SAMPLE_ID,
                    f"duplicate sample_id {int(ids[pos])} "
                    f"(first at {self._parts[first_part][0]} row {first - offsets[first_part]})",
                    int(pos - offsets[part]),
                )
            )
        if len(repeat) > ROWS_SHOWN:
            problems.append(
                Problem(
                    self._parts[0][0],
                    SAMPLE_ID,
                    f"... and {len(repeat) - ROWS_SHOWN} more duplicate sample_ids",
                )
            )
        return problems


def split_tracker(manifest: Manifest) -> SplitTracker:
    """The cross-shard checker for a split of ``manifest``'s task and image format."""
    return SplitTracker(manifest.task, one_row_per_image=manifest.image_format == "encoded")


def sample_rows(manifest: Manifest, split: str, sample: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``sample`` rows of ``split`` (all when it has no more) drawn without replacement by a generator seeded
    with (seed, split), as sorted row numbers within each shard file; a shard without any is absent."""
    shards = manifest.splits[split].shards
    offsets = np.cumsum([0] + [s.rows for s in shards])
    total = int(offsets[-1])
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    chosen = np.sort(rng.choice(total, size=min(sample, total), replace=False))
    shard_of = np.searchsorted(offsets, chosen, side="right") - 1
    return {shards[k].file: chosen[shard_of == k] - offsets[k] for k in np.unique(shard_of)}


def split_problems(
    dataset_dir: Path,
    manifest: Manifest,
    split: str,
    *,
    verify_hash: bool = True,
    tables: list[pa.Table] | None = None,
    sample_ids: SampleIdTracker | None = None,
    tracker: SplitTracker | None = None,
    decode_rows: Mapping[str, np.ndarray] | None = None,
) -> list[Problem]:
    """All problems of one split. Readable shards are appended to ``tables`` when given; sample ids go
    to ``sample_ids`` when given (else duplicates are checked within the split). Encoded images are decoded
    in every row, or only in the rows ``decode_rows`` maps each shard file to (see :func:`sample_rows`)."""
    info = manifest.splits[split]
    own_ids = sample_ids is None
    sample_ids = SampleIdTracker() if own_ids else sample_ids
    tracker = tracker or split_tracker(manifest)
    problems = []
    listed = sum(s.rows for s in info.shards)
    if listed != info.rows:
        problems.append(
            Problem(MANIFEST_NAME, f"splits.{split}.rows", f"{info.rows} rows but its shards list {listed}")
        )
    all_read = True
    for shard in info.shards:
        table, found = open_shard(dataset_dir, shard, verify_hash=verify_hash)
        problems.extend(found)
        if table is None:
            all_read = False
            continue
        problems.extend(
            table_problems(
                table,
                shard.file,
                task=manifest.task,
                feature_dim=manifest.feature_dim,
                feature_dtype=manifest.feature_dtype,
                num_classes=manifest.num_classes,
                expected_rows=shard.rows,
                image_format=manifest.image_format,
            )
        )
        if manifest.image_format == "encoded":
            rows = None if decode_rows is None else decode_rows.get(shard.file, np.zeros(0, np.int64))
            if is_tar_shard(shard.file):  # named by the sample's key
                bad = decode_sample_problems(dataset_dir / shard.file, rows)
                problems.extend(Problem(shard.file, IMAGE, line) for line in bad)
            else:
                problems.extend(decode_problems(table, shard.file, rows))
        problems.extend(tracker.add(table, shard.file))
        sample_ids.add(table, shard.file)
        if tables is not None:
            tables.append(table)
    problems.extend(tracker.finish())
    if own_ids:
        problems.extend(sample_ids.finish())
    if all_read and len(tracker.images) != info.images:
        problems.append(
            Problem(
                MANIFEST_NAME,
                f"splits.{split}.images",
                f"{MANIFEST_NAME} says {info.images} images, the shards hold {len(tracker.images)}",
            )
        )
    return problems


@dataclass
class SplitSummary:
    """What the manifest says about one split."""

    rows: int
    images: int
    shards: int
    decoded: int | None = None  # encoded images decoded by the check (None: not an encoded dataset)


@dataclass
class ValidationReport:
    """Result of :func:`validate_dataset`: summary numbers and every problem found."""

    path: str
    task: str | None = None
    feature_dim: int | None = None
    feature_dtype: str | None = None
    image_format: str | None = None
    image_channels: int | None = None
    image_size: list[int] | None = None
    splits: dict[str, SplitSummary] = field(default_factory=dict)
    vocab_size: int | None = None
    num_classes: int | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    def format(self) -> str:
        """Human-readable summary followed by the problems."""
        lines = [f"dataset {self.path}"]
        if self.task is not None:
            extra = (
                f"vocab {self.vocab_size} words" if self.task == "pairs" else f"{self.num_classes} classes"
            )
            if self.image_format == "encoded":
                images = (
                    f"encoded images ({self.image_channels} channel(s), median size "
                    f"{self.image_size[0]}x{self.image_size[1]})"
                )
            else:
                images = f"feature dim {self.feature_dim} ({self.feature_dtype})"
            lines.append(f"  task {self.task}, {images}, {extra}")
        for name, s in self.splits.items():
            decoded = f"  decoded {s.decoded} of {s.rows} images" if s.decoded is not None else ""
            lines.append(
                f"  {name:5s} {s.rows:>9d} rows  {s.images:>8d} images  {s.shards:>4d} shards{decoded}"
            )
        if self.ok:
            lines.append("OK: no problems found")
        else:
            lines.append(f"{len(self.problems)} problem(s):")
            lines.extend(f"  {p}" for p in self.problems)
        return "\n".join(lines)

    def raise_if_problems(self) -> None:
        """Raise RaydistDataError listing the problems, if any."""
        if self.problems:
            raise RaydistDataError(
                f"dataset {self.path} has {len(self.problems)} problem(s):\n  "
                + "\n  ".join(str(p) for p in self.problems)
            )


def validate_dataset(
    path: str | Path,
    *,
    min_rows: Mapping[str, int] | None = None,
    tasks: Collection[str] | None = None,
    image_sample: int | None = None,
    seed: int = 0,
    manifest: Manifest | None = None,
) -> ValidationReport:
    """Check a dataset folder completely (manifest, vocab, standardisation file, every shard's bytes, schema and values,
    cross-shard and cross-split ids, every encoded image decoded); ``min_rows`` maps split → minimum rows
    required; ``tasks``, when given, the task names the manifest may name (the registered tasks: the data
    layer knows none itself); ``image_sample``, when given, decodes only that many encoded images per split,
    drawn with a generator seeded by (``seed``, split) -- the other checks still read every row. ``manifest``: the
    folder's, already read (and checked) by the caller."""
    if image_sample is not None and image_sample < 0:
        raise RaydistDataError(f"image_sample must be >= 0, got {image_sample}")
    path = Path(path)
    report = ValidationReport(str(path))
    try:
        manifest = manifest_or_load(path, manifest)
    except RaydistDataError as e:
        message = str(e).removeprefix(f"{path / MANIFEST_NAME}: ")
        report.problems.append(Problem(MANIFEST_NAME, None, message))
        return report
    report.task, report.num_classes = manifest.task, manifest.num_classes
    if tasks is not None and manifest.task not in tasks:
        report.problems.append(
            Problem(
                MANIFEST_NAME,
                None,
                f"field 'task': unknown task {manifest.task!r}; expected one of {sorted(tasks)}",
            )
        )
        return report
    report.image_format = manifest.image_format
    if manifest.image_format == "encoded":
        report.image_channels, report.image_size = manifest.image_channels, manifest.image_size
    else:
        report.feature_dim, report.feature_dtype = manifest.feature_dim, manifest.feature_dtype
    if manifest.vocab is not None:
        try:
            report.vocab_size = len(Vocab.load(path / manifest.vocab))
        except RaydistDataError as e:
            report.problems.append(Problem(manifest.vocab, "vocab", str(e)))
    if manifest.tokenizer is not None:
        try:
            SubwordTokenizer.load(path / manifest.tokenizer)
        except RaydistDataError as e:
            report.problems.append(Problem(manifest.tokenizer, "tokenizer", str(e)))
    if manifest.standardization is not None:
        try:
            load_standardization(path)
        except RaydistDataError as e:
            report.problems.append(Problem(manifest.standardization, "standardization", str(e)))
    sample_ids = SampleIdTracker()
    images_of: dict[str, set[int]] = {}
    for split in SPLITS:
        info = manifest.splits[split]
        decode_rows, decoded = None, None
        if manifest.image_format == "encoded":
            if image_sample is not None:
                decode_rows = sample_rows(manifest, split, image_sample, seed)
            decoded = info.rows if decode_rows is None else sum(len(r) for r in decode_rows.values())
        report.splits[split] = SplitSummary(info.rows, info.images, len(info.shards), decoded)
        tracker = split_tracker(manifest)
        report.problems.extend(
            split_problems(
                path, manifest, split, sample_ids=sample_ids, tracker=tracker, decode_rows=decode_rows
            )
        )
        images_of[split] = tracker.images
        need = (min_rows or {}).get(split, 0)
        if info.rows < need:
            report.problems.append(
                Problem(
                    MANIFEST_NAME,
                    f"splits.{split}.rows",
                    f"split {split!r} has {info.rows} rows, fewer than the {need} required",
                )
            )
    report.problems.extend(sample_ids.finish())
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1 :]:
            shared = sorted(images_of[a] & images_of[b])
            if shared:
                report.problems.append(
                    Problem(
                        MANIFEST_NAME,
                        IMAGE_ID,
                        f"{len(shared)} image_id(s) appear in both {a!r} and {b!r} (first: {shared[:5]})",
                    )
                )
    return report


def check_split_size(
    path: str | Path, split: str, global_batch: int, *, manifest: Manifest | None = None
) -> int:
    """Rows of ``split`` per the manifest (``manifest``: the folder's, when read already); raises
    RaydistDataError when fewer than one global batch."""
    manifest = manifest_or_load(path, manifest)
    if split not in manifest.splits:
        raise RaydistDataError(f"unknown split {split!r}; expected one of {list(manifest.splits)}")
    rows = manifest.splits[split].rows
    if rows < global_batch:
        raise RaydistDataError(
            f"{Path(path) / MANIFEST_NAME}: split {split!r} has {rows} rows, fewer than one "
            f"global batch of {global_batch}; lower train.batch_size or use more data"
        )
    return rows
