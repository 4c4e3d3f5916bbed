"""A dataset's shape for the preset rule (:func:`raydist.presets.preset_for_data`): the manifest's train
counts and, for caption datasets, the train captions per image and images sharing a caption (read from the
``image_id`` and caption columns only)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from raydist.data.manifest import Manifest, manifest_or_load
from raydist.data.schema import CAPTION, CAPTIONS, IMAGE_ID
from raydist.data.vocab import tokenize
from raydist.data.webdataset import read_shard, shard_columns
from raydist.presets import SMALL_MAX_IMAGES, DataShape


def shared_caption_images(image_ids: list[int], captions: list[list[str]]) -> int:
    """How many images have a caption (compared as lower-cased word tokens) that a different image also has."""
    owners: dict[str, set[int]] = defaultdict(set)
    for image_id, texts in zip(image_ids, captions, strict=False):
        for text in texts:
            owners[" ".join(tokenize(text))].add(image_id)
    return len({i for ids in owners.values() if len(ids) > 1 for i in ids})


def dataset_shape(dataset_dir: str | Path, *, manifest: Manifest | None = None) -> DataShape:
    """The task and train-split shape of a dataset folder (its manifest is checked; shards are not verified).
    The captions of a set of ``SMALL_MAX_IMAGES`` train images or more are not read (the rule decides on its
    size alone): ``train_captions`` is then the row count and ``shared_caption_images`` None. ``manifest``: the
    folder's, when read already."""
    root = Path(dataset_dir).expanduser()
    manifest = manifest_or_load(root, manifest)
    train = manifest.splits["train"]
    if train.images >= SMALL_MAX_IMAGES:
        return DataShape(
            task=manifest.task,
            train_rows=train.rows,
            train_images=train.images,
            train_captions=train.rows,
            shared_caption_images=None,
        )
    column = CAPTIONS if manifest.image_format == "encoded" else CAPTION
    image_ids: list[int] = []
    captions: list[list[str]] = []
    for shard in train.shards:
        if column not in shard_columns(root / shard.file):
            continue
        table = read_shard(root / shard.file, [IMAGE_ID, column])
        image_ids += table.column(IMAGE_ID).to_pylist()
        texts = table.column(column).to_pylist()
        captions += texts if column == CAPTIONS else [[t] for t in texts]
    return DataShape(
        task=manifest.task,
        train_rows=train.rows,
        train_images=train.images,
        train_captions=sum(map(len, captions)),
        shared_caption_images=shared_caption_images(image_ids, captions),
    )
