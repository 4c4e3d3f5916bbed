"""The pixel limit of every image decode (raydist.data.image_bytes.open_image): a PNG whose header claims
20,000×20,000 pixels and a real decompression bomb (a 9,000×9,000 PNG of about 80 KB) are refused from their
header, before any pixel is decoded, by the data check, a converter (naming the file), the training views' decode
(in memory and in Ray Data's tasks: the same function), the Embedder and serving's /embed (naming the field)."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib

import numpy as np
import pytest
from PIL import Image
from test_retrieval_embedder_images import shapes_ckpt  # noqa: F401 (a fixture)

from raydist.converters.image_folder import convert_image_folder
from raydist.data import RaydistDataError
from raydist.data.image_bytes import MAX_IMAGE_PIXELS, ImageTooLargeError, check_image, open_image
from raydist.data.image_transforms import decode_image, decode_images
from raydist.retrieval.embedder import Embedder
from raydist.serving.service import RequestError, load_retriever


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, idat: bytes = b"") -> bytes:
    """A greyscale 8-bit PNG of ``width`` × ``height`` whose pixel data is ``idat`` (zlib), none by default."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def png_bomb(side: int = 9000) -> bytes:
    """A complete, valid black PNG of ``side`` × ``side`` pixels, compressed row by row (never held decoded)."""
    packer = zlib.compressobj(9)
    row = bytes(side + 1)  # filter byte 0, then the row's pixels
    idat = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    return png(side, side, idat)


HEADER_ONLY = png(20_000, 20_000)
BOMB = png_bomb()


def test_the_inputs_are_what_they_claim():
    assert len(HEADER_ONLY) < 100 and len(BOMB) < 200_000
    with Image.open(io.BytesIO(BOMB)) as image:
        assert image.size == (9000, 9000) and MAX_IMAGE_PIXELS < 9000 * 9000


def test_open_image_refuses_from_the_header():
    with pytest.raises(ImageTooLargeError, match=r"too large: more than 67,108,864 pixels"):
        open_image(HEADER_ONLY)  # Pillow's own check (over twice its default limit), in our words
    with pytest.raises(
        ImageTooLargeError, match=r"too large: 9000×9000 = 81,000,000 pixels, more than 67,108,864"
    ):
        open_image(BOMB)
    small = png(3, 2, zlib.compress(bytes(4) * 2))
    assert open_image(small).size == (3, 2) and open_image(BOMB, max_pixels=9000 * 9000).size == (9000, 9000)
    for data in (HEADER_ONLY, BOMB):
        with pytest.raises(RaydistDataError, match="too large"):
            check_image(data)  # `raydist validate`, the converters, the WebDataset index
        with pytest.raises(RaydistDataError, match="too large"):
            decode_image(data, 3)  # the training views, in memory and in Ray Data's tasks
        with pytest.raises(RaydistDataError, match="too large"):
            decode_images([small, data], 1)


def test_a_converter_refuses_them_naming_the_files(tmp_path):
    src = tmp_path / "src"
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        (src / name).mkdir(parents=True)
        for k in range(4):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(src / name / f"img{k}.png")
    (src / "a" / "header.png").write_bytes(HEADER_ONLY)
    (src / "b" / "bomb.png").write_bytes(BOMB)
    with pytest.raises(RaydistDataError) as refused:
        convert_image_folder(src, tmp_path / "out")
    message = str(refused.value)
    assert f"{src / 'a' / 'header.png'}: too large" in message
    assert f"{src / 'b' / 'bomb.png'}: too large: 9000×9000" in message
    assert not (tmp_path / "out").exists()


def test_the_embedder_and_embed_refuse_them_naming_the_item(shapes_ckpt):  # noqa: F811
    ckpt, _ = shapes_ckpt
    embedder = Embedder.from_checkpoint(ckpt)
    with pytest.raises(ValueError, match=r"images\[1\]: .*too large: 9000×9000"):
        embedder.embed_images([png(8, 8, zlib.compress(bytes(9) * 8)), BOMB])
    served = load_retriever(ckpt, "test")
    for data in (HEADER_ONLY, BOMB):
        body = json.dumps({"images": [base64.b64encode(data).decode()]}).encode()
        with pytest.raises(RequestError) as refused:
            served.parse(body, search=False)
        assert (refused.value.status, refused.value.field) == (413, "images.0")
        assert "too large" in refused.value.message
