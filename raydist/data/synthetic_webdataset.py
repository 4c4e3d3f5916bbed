"""Synthetic WebDataset tar shards in img2dataset's layout, written with ``tarfile`` (for the tests and the
``webdataset`` benchmark): per sample ``KEY.jpg``, ``KEY.png`` or ``KEY.webp``, ``KEY.txt`` (its caption),
``KEY.json`` (metadata) and, for labelled shards, ``KEY.cls``. Images are coloured squares on noise whose class
(and caption) is the colour."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 60, 220), "yellow": (230, 220, 30)}


def image_bytes(colour: tuple[int, int, int], rng: np.random.Generator, fmt: str, size: int = 16) -> bytes:
    """A ``size``² image: noise around a square of ``colour`` at a random place, encoded as ``fmt``."""
    pixels = rng.integers(0, 60, (size, size, 3)).astype(np.uint8)
    y, x = rng.integers(0, size // 2, 2)
    pixels[y : y + size // 2, x : x + size // 2] = colour
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Append a file member ``name`` holding ``data``."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_webdataset(
    root: Path,
    *,
    labels: bool = False,
    per_split: dict[str, int] | None = None,
    per_shard: int = 24,
    seed: int = 0,
    side: int = 16,
) -> Path:
    """``root/{train,val,test}/NNNNN.tar`` with ``per_split`` samples each (keys numbered over the folder as
    img2dataset numbers them), the image format JPEG, PNG and WebP in turn, plus img2dataset's ``NNNNN_stats.json``
    and ``NNNNN.parquet`` beside each tar (which a reader must ignore); images ``side`` pixels square."""
    per_split = per_split or {"train": 96, "val": 24, "test": 24}
    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    key = 0
    for split, count in per_split.items():
        folder = root / split
        folder.mkdir(parents=True)
        for shard, start in enumerate(range(0, count, per_shard)):
            with tarfile.open(folder / f"{shard:05d}.tar", "w") as tar:
                for _ in range(start, min(start + per_shard, count)):
                    cls = int(rng.integers(len(names)))
                    fmt, ext = (("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp"))[key % 3]
                    name = f"{key:09d}"
                    add_member(tar, f"{name}.{ext}", image_bytes(COLOURS[names[cls]], rng, fmt, side))
                    add_member(tar, f"{name}.txt", f"a {names[cls]} square on noise".encode())
                    add_member(tar, f"{name}.json", json.dumps({"key": name, "status": "success"}).encode())
                    if labels:
                        add_member(tar, f"{name}.cls", str(cls).encode())
                    key += 1
            (folder / f"{shard:05d}_stats.json").write_text(json.dumps({"successes": count}))
            (folder / f"{shard:05d}.parquet").write_bytes(b"PAR1 not really")
    return root
