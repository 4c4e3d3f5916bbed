"""A dataset's shape for the preset rule (raydist/data/shape.py): train counts from the manifest, and the images
sharing a caption counted against a brute-force pairwise comparison."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from raydist.data import DatasetWriter, Vocab, tokenize
from raydist.data.shape import dataset_shape, shared_caption_images
from raydist.presets import SMALL_MAX_IMAGES


def _pairwise_shared(image_ids: list[int], captions: list[list[str]]) -> int:
    """Images with a caption equal (as word tokens) to a caption of a different image, by comparing every pair."""
    found = set()
    for (a, ca), (b, cb) in itertools.combinations(zip(image_ids, captions, strict=False), 2):
        if a != b and any(tokenize(x) == tokenize(y) for x in ca for y in cb):
            found.update((a, b))
    return len(found)


def _write_pairs(out: Path, captions: dict[int, list[str]]) -> Path:
    """A features dataset whose train split holds ``captions`` (image id → its captions, one row each)."""
    with DatasetWriter(out, rows_per_shard=7) as writer:
        ids = [i for i, texts in captions.items() for _ in texts]
        texts = [t for i in captions for t in captions[i]]
        writer.vocab = Vocab.build(texts, min_count=1)
        writer.add_split(
            "train", np.array(ids), np.arange(len(ids)), np.zeros((len(ids), 2), np.float32), texts
        )
        for split, first in (("val", 1000), ("test", 2000)):
            writer.add_split(
                split,
                np.array([first, first + 1]),
                np.array([first, first + 1]),
                np.zeros((2, 2), np.float32),
                ["a b", "c d"],
            )
    return out


def test_shared_captions_match_pairwise_count() -> None:
    rng = np.random.default_rng(0)
    words = ["dog", "cat", "Red", "red", "a", "ball", "runs", "sits", "grass", "snow"]
    image_ids = list(range(40))
    captions = [
        [" ".join(rng.choice(words, size=rng.integers(2, 4))) + rng.choice(["", "."]) for _ in range(2)]
        for _ in image_ids
    ]
    expected = _pairwise_shared(image_ids, captions)
    assert 0 < expected < len(image_ids)  # the draw has both shared and unshared images
    assert shared_caption_images(image_ids, captions) == expected
    # an image repeating its own caption shares it with no other image
    assert shared_caption_images([1, 2], [["a dog", "A dog."], ["a cat"]]) == 0


def test_dataset_shape_counts_the_train_split(tmp_path: Path) -> None:
    captions = {i: [f"w{i} x", f"w{i} y"] for i in range(12)}
    captions[3] = ["w3 x", "Shared words"]
    captions[8] = ["shared words.", "w8 y"]
    data = _write_pairs(tmp_path / "d", captions)
    shape = dataset_shape(data)
    ids = [i for i, texts in captions.items() for _ in texts]
    assert shape.task == "pairs"
    assert (shape.train_rows, shape.train_images, shape.train_captions) == (len(ids), 12, len(ids))
    assert shape.shared_caption_images == _pairwise_shared(list(captions), list(captions.values()))
    assert shape.captions_per_image == len(ids) / 12


def test_large_set_read_from_the_manifest_alone(tmp_path: Path) -> None:
    data = _write_pairs(tmp_path / "d", {i: [f"w{i}"] for i in range(4)})
    manifest = (data / "manifest.json").read_text()
    big = manifest.replace('"images": 4', f'"images": {SMALL_MAX_IMAGES}', 1)
    assert big != manifest
    (data / "manifest.json").write_text(big)
    for shard in (data / "train").iterdir():  # the captions are not read: unreadable shards do not matter
        shard.write_bytes(b"not parquet")
    shape = dataset_shape(data)
    assert shape.train_images == SMALL_MAX_IMAGES and shape.shared_caption_images is None
