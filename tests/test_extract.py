"""`raydist embed` (raydist/extract.py): an image encoder's outputs over an encoded-image dataset written as a
feature dataset. The vectors are checked against the encoder run here on eval views made from the PNG pixels
(decode → resize + centre crop → normalise), the rows against the source's captions and labels; the output is
a dataset `raydist train` takes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_tasks_images import SIZE, write_colour_folders, write_shape_pairs

from raydist.cli import main
from raydist.config import ConfigError, load_config
from raydist.data import Vocab, dataset_task, load_manifest, read_split, validate_dataset
from raydist.data.image_transforms import decode_image, default_mean_std, eval_view
from raydist.extract import extract_features, pretrained_encoder
from raydist.models.image_encoders import BackboneEncoder, build_image_encoder
from raydist.retrieval.trained import load_trained
from raydist.train.trainer import run_training


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """An encoded pairs dataset: 9 colour × shape classes, 2–3 captions per image."""
    return write_shape_pairs(
        tmp_path_factory.mktemp("shapes-embed"),
        per_class={"train": 4, "val": 2, "test": 2},
        rows_per_shard=20,
    )


@pytest.fixture(scope="module")
def colours(tmp_path_factory):
    """An encoded labels dataset (ImageFolder tree): 3 colour classes, 24 images each."""
    return write_colour_folders(tmp_path_factory.mktemp("colours-embed"), seed=2)


def views_of(table, size: int, crop_fraction: float = 0.875) -> torch.Tensor:
    """Eval views of a split's images, made here from the PNG bytes."""
    mean, std = default_mean_std(3)
    return torch.as_tensor(
        np.stack(
            [
                eval_view(decode_image(b, 3), size, mean=mean, std=std, crop_fraction=crop_fraction)
                for b in table.column("image").to_pylist()
            ]
        )
    )


def test_a_pretrained_backbone_embeds_every_caption_row_of_an_image_caption_set(shapes, tmp_path):
    weights = tmp_path / "cnn.pt"
    torch.manual_seed(5)
    reference = build_image_encoder("small-cnn", 8, channels=3, image_size=SIZE)
    torch.save(reference.backbone.state_dict(), weights)
    out = tmp_path / "feats"
    manifest = extract_features(
        shapes,
        out,
        pretrained_encoder("small-cnn", load_manifest(shapes), weights=weights),
        progress=lambda *a: None,
    )
    assert manifest.image_format == "features" and manifest.task == "pairs"
    assert not validate_dataset(out).problems
    assert Vocab.load(out / "vocab.json").words == Vocab.load(shapes / "vocab.json").words
    reference.eval()
    for split in ("train", "val", "test"):
        source, written = read_split(shapes, split), read_split(out, split)
        with torch.no_grad():
            want = reference.backbone(views_of(source, SIZE)).numpy()
        captions = source.column("captions").to_pylist()
        rows_of_image = np.repeat(np.arange(len(captions)), [len(c) for c in captions])
        assert written.column("caption").to_pylist() == [c for caps in captions for c in caps]
        assert (
            written.column("image_id").to_pylist()
            == np.asarray(source.column("image_id"))[rows_of_image].tolist()
        )
        got = np.asarray(written.column("image").to_pylist(), dtype=np.float32)
        np.testing.assert_allclose(got, want[rows_of_image], rtol=1e-5, atol=1e-6)
    # the output is a dataset training takes (in-process, a few steps)
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(out),
            "train.num_workers": 0,
            "train.epochs": 1,
            "train.storage_path": str(tmp_path / "runs"),
        },
    )
    assert run_training(cfg).test_metrics["rsum"] > 0


def test_a_trained_checkpoint_embeds_with_its_head_on_a_labelled_set(colours, tmp_path, capsys):
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(colours),
            "model.image_encoder": "small-cnn",
            "train.num_workers": 0,
            "train.epochs": 1,
            "train.batch_size": 12,
            "train.storage_path": str(tmp_path / "runs"),
            "train.run_name": "img",
            "eval.recall_at": [1, 2],
        },
        task_of=dataset_task,
    )
    run = run_training(cfg, evaluate_test=False).run_dir
    out = tmp_path / "feats"
    assert (
        main(
            ["embed", "--checkpoint", str(run), "--data", str(colours), "--out", str(out), "--output", "head"]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert f"wrote {out}: task labels" in printed and f"raydist train --data {out}" in printed
    trained = load_trained(run, colours)
    (encoder,) = [m for m in trained.model.modules() if isinstance(m, BackboneEncoder)]
    manifest = load_manifest(out)
    assert manifest.feature_dim == cfg.model.embed_dim and manifest.num_classes == 3
    for split in ("train", "val", "test"):
        source, written = read_split(colours, split), read_split(out, split)
        with torch.no_grad():
            # the head's output, not normalised, on the run's eval views: the whole image (16 px trains pad-and-crop)
            want = encoder.eval()(views_of(source, SIZE, crop_fraction=1.0)).numpy()
        np.testing.assert_allclose(
            np.asarray(written.column("image").to_pylist()), want, rtol=1e-5, atol=1e-6
        )
        assert written.column("label").to_pylist() == source.column("label").to_pylist()
        assert written.column("sample_id").to_pylist() == source.column("sample_id").to_pylist()
    assert json.loads((out / "manifest.json").read_text())["source"]["kind"] == "embed"


def test_refusals_name_what_is_wrong(tiny_dataset, shapes, tmp_path):
    with pytest.raises(ConfigError, match="already holds feature vectors"):
        extract_features(tiny_dataset, tmp_path / "x", pretrained_encoder("small-cnn", load_manifest(shapes)))
    assert main(["embed", "--data", str(shapes), "--out", str(tmp_path / "y")]) == 2  # neither source given
    assert (
        main(
            [
                "embed",
                "--data",
                str(shapes),
                "--out",
                str(tmp_path / "y"),
                "--image-encoder",
                "small-cnn",
                "--output",
                "head",
            ]
        )
        == 2
    )  # an untrained head
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
