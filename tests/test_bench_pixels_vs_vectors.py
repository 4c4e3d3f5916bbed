"""`raydist bench pixels-vs-vectors` (raydist/benchmarks/pixels_vs_vectors.py): the flattened-pixel dataset
against pixels decoded here with Pillow, the 1-NN baselines against brute-force float64 computations, and one
smoke run of the whole benchmark in process (no Ray) from the command line on a tiny encoded pairs dataset with
2 or 3 captions per image."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from raydist.benchmarks.pixels_vs_vectors import (
    flatten_pixels,
    label_split,
    pca_nn1,
    pixel_nn1,
    pixel_transform,
    raw_pixels,
)
from raydist.cli import main
from raydist.converters.image_folder import convert_image_folder
from raydist.converters.karpathy import convert_karpathy
from raydist.data import load_manifest, read_split
from raydist.recipe import run_recipe

SIDE = 12


def band_image(c: int, rng: np.random.Generator) -> np.ndarray:
    """A 12×12 greyscale picture: noise, and a bright band at rows 2 + 4c, 3 + 4c."""
    img = rng.integers(0, 120, (SIDE, SIDE)).astype(np.uint8)
    img[2 + 4 * c : 4 + 4 * c] = 230
    return img


@pytest.fixture(scope="module")
def grey(tmp_path_factory):
    """An encoded labels dataset of 12×12 greyscale PNGs: 3 classes (the band's place) × 20, and its
    flattened-pixel dataset."""
    root = tmp_path_factory.mktemp("grey-pixels")
    rng = np.random.default_rng(0)
    for c in range(3):
        (root / "src" / f"c{c}").mkdir(parents=True)
        for k in range(20):
            Image.fromarray(band_image(c, rng), mode="L").save(root / "src" / f"c{c}" / f"{k}.png")
    data = convert_image_folder(root / "src", root / "data", val_fraction=0.25, test_fraction=0.25)
    transform = pixel_transform(run_recipe(data).config, data)
    return data, transform, flatten_pixels(data, root / "flat", transform)


def band_pairs(root) -> Path:
    """An encoded pairs dataset of :func:`band_image` pictures: 135 train, 12 val, 12 test images, 2 or 3
    captions each naming the band's place."""
    rng = np.random.default_rng(1)
    entries = []
    for k, split in enumerate(["train"] * 135 + ["val"] * 12 + ["test"] * 12):
        c = k % 3
        Image.fromarray(band_image(c, rng), mode="L").save(root / f"{k}.png")
        captions = [
            f"band {('top', 'middle', 'bottom')[c]}",
            f"a {('high', 'central', 'low')[c]} band",
            "stripe",
        ]
        entries.append(
            {
                "filename": f"{k}.png",
                "split": split,
                "imgid": k,
                "sentences": [{"raw": t} for t in captions[: 2 + k % 2]],
            }
        )
    (root / "dataset.json").write_text(json.dumps({"images": entries}))
    return convert_karpathy(root / "dataset.json", root, root / "data", min_count=1)


def test_the_flattened_pixels_are_the_decoded_png_pixels_normalised(grey) -> None:
    data, transform, flat = grey
    manifest = load_manifest(flat)
    assert (
        manifest.image_format == "features"
        and manifest.task == "labels"
        and manifest.feature_dim == SIDE * SIDE
    )
    for split in ("train", "val", "test"):
        source, vectors = read_split(data, split).to_pylist(), read_split(flat, split).to_pylist()
        assert [r["image_id"] for r in vectors] == [r["image_id"] for r in source]
        assert [r["label"] for r in vectors] == [r["label"] for r in source]
        for src, vec in list(zip(source, vectors, strict=False))[:4]:
            with Image.open(io.BytesIO(src["image"])) as img:
                pixels = np.asarray(img.convert("L"), dtype=np.float64) / 255
            expected = ((pixels - 0.5) / 0.5).ravel()
            np.testing.assert_allclose(np.asarray(vec["image"], dtype=np.float64), expected, atol=1e-6)
            np.testing.assert_allclose(
                raw_pixels(np.asarray([vec["image"]]), transform)[0], pixels.ravel(), atol=1e-6
            )


def brute_nn1(x: np.ndarray, labels: np.ndarray) -> float:
    """Leave-one-out cosine 1-NN accuracy in %, float64, every pair scored."""
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    sims = unit @ unit.T
    np.fill_diagonal(sims, -np.inf)
    return 100.0 * float((labels[sims.argmax(1)] == labels).mean())


def test_the_one_nn_baselines_match_brute_force(grey) -> None:
    _, transform, flat = grey
    train = raw_pixels(label_split(flat, "train")[0], transform)
    test, labels = label_split(flat, "test")
    test = raw_pixels(test, transform)
    assert pixel_nn1(test, labels) == pytest.approx(brute_nn1(test, labels))
    mean = train.mean(0)
    _, vectors = np.linalg.eigh(np.cov(train - mean, rowvar=False))
    top = vectors[:, ::-1][:, :5]  # the 5 largest principal axes
    assert pca_nn1(train, test, labels, 5) == pytest.approx(brute_nn1((test - mean) @ top, labels))
    rng = np.random.default_rng(1)  # scores that are not all equal: random points, 4 classes
    x, y = rng.normal(size=(60, 7)), rng.integers(0, 4, 60)
    assert pixel_nn1(x, y) == pytest.approx(brute_nn1(x, y))


def test_the_bench_runs_in_process_on_an_image_caption_set(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(
        "raydist.plots.plot_run", lambda *a, **k: []
    )  # each run's PNGs: seconds, not looked at
    data = band_pairs(tmp_path)
    assert main(["bench", "pixels-vs-vectors", "--data", str(data), "--smoke", "--in-process"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("### pixels-vs-vectors (smoke)") :]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| variant | i2t R@1 |") and rows[0].endswith("| rsum | steps | wall s |")
    names = [r.split(" | ")[0].removeprefix("| ") for r in rows[1:5]]
    assert names == [
        "pixels: small-cnn (defaults)",
        "vectors: linear on flattened pixels",
        "baseline: CCA-16 on flattened pixels",
        "baseline: least squares on flattened pixels",
    ]
    # one epoch each: one step of the 135 images; 2 of their 337 caption rows (one row per caption)
    assert [r.split(" | ")[-2] for r in rows[1:3]] == ["1", "2"]
    verdict = [r.split(" | ")[0].removeprefix("| ") for r in rows[5:]]
    assert verdict == [
        "test rsum",
        "vectors: linear on flattened pixels",
        "best baseline: least squares on flattened pixels",
    ]
    assert out.count("[raydist] pixels-vs-vectors: ") == 4  # one progress line per row, training's swallowed
