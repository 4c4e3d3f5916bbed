"""Shard schema (README.md#data): column names and Arrow types, dataset layout constants, the data error.

Image format ``features``: ``image`` is a float vector; one Parquet row per caption (task ``pairs``) or per
sample (task ``labels``, and any other registered task, which uses the labelled layout). Image format
``encoded``: ``image`` is a PNG or JPEG file's bytes and every row is one image (task ``pairs``: with the
list of its ``captions``).
"""

from __future__ import annotations

import pyarrow as pa

from raydist.dataset_task import MANIFEST_NAME  # noqa: F401  (re-exported: the data layer's name for it)

FORMAT_VERSION = 1
TASKS = ("pairs", "labels")  # the shipped tasks; any other registered task uses the labelled layout
SPLITS = ("train", "val", "test")

VOCAB_NAME = "vocab.json"
SHARD_PATTERN = "part-{index:05d}.parquet"
DEFAULT_ROWS_PER_SHARD = 4096
DEFAULT_IMAGES_PER_SHARD = 1024  # encoded images: about 100-200 MB of JPEG bytes per shard at COCO sizes
IMAGE_FORMATS = ("features", "encoded")

IMAGE_ID, SAMPLE_ID, IMAGE, CAPTION, CAPTIONS, LABEL, CLEAN_LABEL = (
    "image_id",
    "sample_id",
    "image",
    "caption",
    "captions",
    "label",
    "clean_label",
)
COLUMNS = {  # per image format: the columns a shard may have
    "features": (IMAGE_ID, SAMPLE_ID, IMAGE, CAPTION, LABEL, CLEAN_LABEL),
    "encoded": (IMAGE_ID, SAMPLE_ID, IMAGE, CAPTIONS, LABEL, CLEAN_LABEL),
}
FEATURE_TYPES = {"float32": pa.float32(), "float16": pa.float16()}


class RaydistDataError(ValueError):
    """A dataset that cannot be used: missing or corrupt file, wrong schema, bad values, bad arguments."""


def required_columns(task: str, image_format: str = "features") -> tuple[str, ...]:
    """Columns every shard of a ``task`` dataset must have (``label``/``clean_label`` are optional
    for ``pairs``, ``caption``/``captions`` are optional for ``labels``)."""
    if task == "pairs":
        return (IMAGE_ID, SAMPLE_ID, IMAGE, CAPTIONS if image_format == "encoded" else CAPTION)
    return (IMAGE_ID, SAMPLE_ID, IMAGE, LABEL)


def arrow_schema(
    task: str,
    feature_dim: int | None,
    *,
    feature_dtype: str = "float32",
    captions: bool = True,
    labels: bool = False,
    clean_labels: bool = False,
) -> pa.Schema:
    """The Arrow schema of a shard with the given optional columns, in canonical column order.

    ``feature_dim`` None means image format ``encoded``: ``image`` is binary and the captions column is
    ``captions: list<string>``; otherwise ``image`` is ``fixed_size_list<feature_dtype>[feature_dim]`` and
    the captions column is ``caption: string``."""
    encoded = feature_dim is None
    image_type = pa.binary() if encoded else pa.list_(FEATURE_TYPES[feature_dtype], feature_dim)
    fields = [
        pa.field(IMAGE_ID, pa.int64(), nullable=False),
        pa.field(SAMPLE_ID, pa.int64(), nullable=False),
        pa.field(IMAGE, image_type, nullable=False),
    ]
    if captions:
        fields.append(
            pa.field(CAPTIONS, pa.list_(pa.string()), nullable=False)
            if encoded
            else pa.field(CAPTION, pa.string(), nullable=False)
        )
    if labels:
        fields.append(pa.field(LABEL, pa.int64(), nullable=False))
    if clean_labels:
        fields.append(pa.field(CLEAN_LABEL, pa.int64(), nullable=False))
    return pa.schema(fields)


def _is_string(typ: pa.DataType) -> bool:
    return typ in (pa.string(), pa.large_string())


def column_type_problem(
    name: str, typ: pa.DataType, feature_dim: int | None, image_format: str = "features"
) -> str | None:
    """Why column ``name`` of Arrow type ``typ`` is not allowed in a shard of ``image_format``, or None when
    it is (``feature_dim`` is the manifest's, for ``features``)."""
    if name not in COLUMNS[image_format]:
        other = {
            CAPTION: f"; an {image_format} dataset holds an image's captions in '{CAPTIONS}'",
            CAPTIONS: f"; a {image_format} dataset holds one caption per row in '{CAPTION}'",
        }.get(name, "")
        return f"unexpected column (allowed: {', '.join(COLUMNS[image_format])}){other}"
    if name in (IMAGE_ID, SAMPLE_ID, LABEL, CLEAN_LABEL):
        return None if typ == pa.int64() else f"expected int64, got {typ}"
    if name == CAPTION:
        return None if _is_string(typ) else f"expected string, got {typ}"
    if name == CAPTIONS:
        ok = (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and _is_string(typ.value_type)
        return None if ok else f"expected list<string> (the image's captions), got {typ}"
    if image_format == "encoded":
        ok = typ in (pa.binary(), pa.large_binary())
        return None if ok else f"expected binary (a PNG or JPEG file's bytes), got {typ}"
    if not pa.types.is_fixed_size_list(typ) or typ.value_type not in FEATURE_TYPES.values():
        return f"expected fixed_size_list<float32 or float16>[{feature_dim}], got {typ}"
    if typ.list_size != feature_dim:
        return f"feature dim {typ.list_size} differs from the manifest's feature_dim {feature_dim}"
    return None
