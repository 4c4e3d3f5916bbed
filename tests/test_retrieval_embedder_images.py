"""raydist.Embedder.embed_images (new images → embeddings) against evaluation's own embedding of a split's images
(Task.embed: decoded once, eval view, the model's image side), for both tasks trained on encoded images; bytes and
Pillow images alike; undecodable bytes and feature-vector models refused with the item named."""

from __future__ import annotations

import io

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image
from test_retrieval_embedder import _checkpoint
from test_tasks_images import write_colour_folders, write_shapes

from raydist.converters.karpathy import convert_karpathy
from raydist.retrieval.embedder import Embedder
from raydist.retrieval.trained import load_trained


@pytest.fixture(scope="module")
def shapes_ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    (root / "images").mkdir()
    src = write_shapes(root / "images", per_class={"train": 2, "val": 1, "test": 2})
    data = convert_karpathy(src, root / "images", root / "data", min_count=1)
    ckpt = _checkpoint(
        root / "run" / "checkpoint_00000001",
        data,
        **{"model.image_encoder": "small-cnn", "model.nesting": [16, 64]},
    )
    return ckpt, data


@pytest.fixture(scope="module")
def colours_ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("colours")
    data = write_colour_folders(root, seed=2)
    return _checkpoint(
        root / "run" / "checkpoint_00000001", data, **{"model.image_encoder": "small-cnn"}
    ), data


def _image_bytes(data_dir, split: str) -> list[bytes]:
    """The split's encoded images straight from its Parquet shards, in row order."""
    table = pq.read_table(sorted((data_dir / split).glob("*.parquet")))
    return table.column("image").to_pylist()


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_pairs_images_embed_as_evaluation_embeds_the_split(shapes_ckpt):
    ckpt, data = shapes_ckpt
    images = _image_bytes(data, "test")  # one row per image
    split = load_trained(ckpt).embed("test").database  # the images, in row order
    embedder = Embedder.from_checkpoint(ckpt.parent)
    z = embedder.embed_images(images)
    assert z.shape == split.shape and z.dtype == np.float32
    assert _cosines(z, split).min() >= 0.9999
    pil = [Image.open(io.BytesIO(b)) for b in images]  # Pillow images take the same path
    np.testing.assert_allclose(embedder.embed_images(pil), z, atol=1e-6)
    # a Matryoshka prefix: the full embedding cut and re-normalised, in float64
    cut = Embedder.from_checkpoint(ckpt, dim=16).embed_images(images[:3])
    full = z[:3, :16].astype(np.float64)
    np.testing.assert_allclose(cut, full / np.linalg.norm(full, axis=1, keepdims=True), atol=1e-5)


def test_labels_images_embed_as_evaluation_embeds_the_split(colours_ckpt):
    ckpt, data = colours_ckpt
    images = _image_bytes(data, "val")
    split = load_trained(ckpt).embed("val").database
    z = Embedder.from_checkpoint(ckpt).embed_images(images)
    assert _cosines(z, split).min() >= 0.9999


def test_embed_images_refuses_what_it_cannot_embed(shapes_ckpt, labels_dataset, tmp_path):
    ckpt, data = shapes_ckpt
    embedder = Embedder.from_checkpoint(ckpt)
    good = _image_bytes(data, "test")[0]
    with pytest.raises(ValueError, match=r"images\[1\]: not a decodable PNG/JPEG image"):
        embedder.embed_images([good, b"not an image"])
    with pytest.raises(ValueError, match="non-empty list"):
        embedder.embed_images([])
    with pytest.raises(TypeError, match=r"images\[0\]: expected bytes or a PIL image, got str"):
        embedder.embed_images(["a caption"])
    features = Embedder.from_checkpoint(_checkpoint(tmp_path / "checkpoint_00000001", labels_dataset))
    with pytest.raises(ValueError, match="trained on feature vectors"):
        features.embed_images([good])
