"""The preset a run without --preset gets from its dataset (raydist/presets/__init__.py, preset_for_data) and the
line `raydist train --data DIR` prints about it; --preset, --preset-file and the embedded run are unchanged."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from raydist.cli import main, preset_from_args
from raydist.config import dump_yaml, load_config
from raydist.data import DatasetWriter, Vocab
from raydist.presets import SHARED_CAPTION_SHARE, SMALL_MAX_IMAGES, DataShape, preset_for_data


def _pairs(images: int, per_image: int = 1, shared: int = 0) -> DataShape:
    return DataShape("pairs", images * per_image, images, images * per_image, shared)


@pytest.mark.parametrize("images", [1, 1_000, SMALL_MAX_IMAGES - 1, SMALL_MAX_IMAGES, 10 * SMALL_MAX_IMAGES])
def test_size_threshold(images: int) -> None:
    choice = preset_for_data(_pairs(images))
    assert choice.name == ("small" if images < SMALL_MAX_IMAGES else "default")
    assert f"{images:,} train images" in choice.reason


def test_shared_captions_and_captions_per_image() -> None:
    n = 1_000
    limit = int(np.ceil(SHARED_CAPTION_SHARE * n))  # the fewest shared images that reach the share
    assert preset_for_data(_pairs(n, per_image=5, shared=limit - 1)).name == "default"
    assert preset_for_data(_pairs(n, per_image=5, shared=limit)).name == "small"
    assert preset_for_data(_pairs(n, per_image=1, shared=0)).name == "small"  # one caption per image
    assert preset_for_data(_pairs(n, per_image=2, shared=0)).name == "default"
    assert preset_for_data(_pairs(SMALL_MAX_IMAGES, per_image=1, shared=n)).name == "default"  # size decides
    assert f"{limit / n:.0%} of images share" in preset_for_data(_pairs(n, per_image=5, shared=limit)).reason


@pytest.mark.parametrize("rows", [10, SMALL_MAX_IMAGES - 1, SMALL_MAX_IMAGES])
def test_labels_task_keeps_default(rows: int) -> None:
    choice = preset_for_data(DataShape("labels", rows, rows))
    assert choice.name == "default" and "task labels" in choice.reason


def test_the_labels_line_says_what_was_chosen_for_class_labels_and_why() -> None:
    line = preset_for_data(DataShape("labels", 1100, 1100)).line()
    assert line == (
        "[raydist] preset default: 1,100 class-labelled train rows (task labels); small and the vsepp presets "
        "are schedules for image-caption ranking, which labels do not use -- --preset to choose"
    )


def _write(out: Path, task: str, captions_per_image: int, images: int = 24) -> Path:
    """A tiny dataset: ``images`` train images with unique captions (pairs) or labels."""
    with DatasetWriter(out, task=task, num_classes=3 if task == "labels" else None) as writer:
        for split, first, n in (("train", 0, images), ("val", 10_000, 6), ("test", 20_000, 6)):
            ids = np.repeat(np.arange(first, first + n), captions_per_image)
            feats = np.random.default_rng(first).normal(size=(len(ids), 4)).astype(np.float32)
            if task == "labels":
                writer.add_split(split, ids, ids, feats, labels=ids % 3)
                continue
            texts = [
                f"w{i} c{k}" for i, k in zip(ids, np.tile(np.arange(captions_per_image), n), strict=False)
            ]
            if split == "train":
                writer.vocab = Vocab.build(texts, min_count=1)
            writer.add_split(split, ids, np.arange(len(ids)) + first, feats, texts)
    return out


@pytest.mark.parametrize(
    ("task", "per_image", "expected"),
    [("pairs", 1, "small"), ("pairs", 5, "default"), ("labels", 1, "default")],
)
def test_train_print_config_says_the_pick(
    tmp_path: Path, capsys, task: str, per_image: int, expected: str
) -> None:
    data = _write(tmp_path / "d", task, per_image)
    assert main(["train", "--data", str(data), "--print-config"]) == 0
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("[raydist] preset ")]
    assert (
        len(lines) == 1 and lines[0].startswith(f"[raydist] preset {expected}: ") and "--preset" in lines[0]
    )
    assert (
        out.strip() == dump_yaml(load_config(expected, overrides={"data.path": str(data.resolve())})).strip()
    )


def test_preset_options_and_embedded_run_unchanged(tmp_path: Path, capsys) -> None:
    data = _write(tmp_path / "d", "pairs", 1)
    assert main(["train", "--data", str(data), "--preset", "default", "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert "[raydist] preset" not in err + out
    assert (
        out.strip() == dump_yaml(load_config("default", overrides={"data.path": str(data.resolve())})).strip()
    )
    assert main(["train", "--print-config"]) == 0  # no --data: the embedded run's default preset
    out, err = capsys.readouterr()
    assert "[raydist] preset" not in err + out and out.strip() == dump_yaml(load_config("default")).strip()
    preset_file = tmp_path / "p.yaml"
    preset_file.write_text("loss:\n  margin: 0.3\n")
    args = argparse.Namespace(preset=None, preset_file=str(preset_file), data=str(data))
    assert preset_from_args(args) is None and capsys.readouterr().out == ""


def test_training_line_goes_to_stdout(tmp_path: Path, capsys) -> None:
    data = _write(tmp_path / "d", "pairs", 1)
    args = argparse.Namespace(preset=None, preset_file=None, data=str(data))
    assert preset_from_args(args) == "small"
    assert capsys.readouterr().out.startswith(
        f"[raydist] preset small: 24 train images (< {SMALL_MAX_IMAGES:,})"
    )
