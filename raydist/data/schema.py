"""Shard schema (README.md#data): column names and Arrow types, dataset layout constants, the data error.

One Parquet row per caption (task ``pairs``) or per sample (task ``labels``, and any other registered task,
which uses the labelled layout).
"""

from __future__ import annotations

import pyarrow as pa

FORMAT_VERSION = 1
TASKS = ("pairs", "labels")  # the shipped tasks; any other registered task uses the labelled layout
SPLITS = ("train", "val", "test")
MANIFEST_NAME = "manifest.json"
VOCAB_NAME = "vocab.json"
SHARD_PATTERN = "part-{index:05d}.parquet"
DEFAULT_ROWS_PER_SHARD = 4096

IMAGE_ID, SAMPLE_ID, IMAGE, CAPTION, LABEL, CLEAN_LABEL = (
    "image_id", "sample_id", "image", "caption", "label", "clean_label"
)
COLUMNS = (IMAGE_ID, SAMPLE_ID, IMAGE, CAPTION, LABEL, CLEAN_LABEL)
FEATURE_TYPES = {"float32": pa.float32(), "float16": pa.float16()}


class RaydistDataError(ValueError):
    """A dataset that cannot be used: missing or corrupt file, wrong schema, bad values, bad arguments."""


def required_columns(task: str) -> tuple[str, ...]:
    """Columns every shard of a ``task`` dataset must have (``label``/``clean_label`` are optional
    for ``pairs``, ``caption`` is optional for ``labels``)."""
    if task == "pairs":
        return (IMAGE_ID, SAMPLE_ID, IMAGE, CAPTION)
    return (IMAGE_ID, SAMPLE_ID, IMAGE, LABEL)


def arrow_schema(
    task: str,
    feature_dim: int,
    *,
    feature_dtype: str = "float32",
    captions: bool = True,
    labels: bool = False,
    clean_labels: bool = False,
) -> pa.Schema:
    """The Arrow schema of a shard with the given optional columns, in canonical column order."""
    fields = [
        pa.field(IMAGE_ID, pa.int64(), nullable=False),
        pa.field(SAMPLE_ID, pa.int64(), nullable=False),
        pa.field(IMAGE, pa.list_(FEATURE_TYPES[feature_dtype], feature_dim), nullable=False),
    ]
    if captions:
        fields.append(pa.field(CAPTION, pa.string(), nullable=False))
    if labels:
        fields.append(pa.field(LABEL, pa.int64(), nullable=False))
    if clean_labels:
        fields.append(pa.field(CLEAN_LABEL, pa.int64(), nullable=False))
    return pa.schema(fields)


def column_type_problem(name: str, typ: pa.DataType, feature_dim: int) -> str | None:
    """Why column ``name`` of Arrow type ``typ`` is not allowed, or None when it is."""
    if name in (IMAGE_ID, SAMPLE_ID, LABEL, CLEAN_LABEL):
        return None if typ == pa.int64() else f"expected int64, got {typ}"
    if name == CAPTION:
        return None if typ in (pa.string(), pa.large_string()) else f"expected string, got {typ}"
    if name == IMAGE:
        if not pa.types.is_fixed_size_list(typ) or typ.value_type not in FEATURE_TYPES.values():
            return f"expected fixed_size_list<float32 or float16>[{feature_dim}], got {typ}"
        if typ.list_size != feature_dim:
            return f"feature dim {typ.list_size} differs from the manifest's feature_dim {feature_dim}"
        return None
    return f"unexpected column (allowed: {', '.join(COLUMNS)})"
