"""The `torchvision:<model>` (and `timm:<model>`) image encoders on a real torchvision and timm, the `vision`
extra (every test here is marked `vision`: where either does not import, tests/conftest.py leaves them out and
says so). Checked against torchvision's own
models: the backbone's features are what the model's classifier reads (the classifier of the full model applied
to them gives the model's own logits), saved torchvision state dicts load, `raydist embed` writes torchvision's
features, `raydist train --data` picks a ResNet for larger images, and the VSE++ fine-tuning preset runs with one.
The freeze → fine-tune switch and its resume on a real ResNet-18 are in tests/test_train_optim.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from test_extract import colours, views_of  # noqa: F401  (colours: a module fixture)
from test_tasks_images import shapes  # noqa: F401  (a module fixture: 9 colour × shape classes, 108 train images)
from torch import nn

from raydist.checkpoint import load_checkpoint, run_checkpoints
from raydist.cli import main
from raydist.converters.image_folder import convert_image_folder
from raydist.data import read_split
from raydist.models.image_encoders import build_image_encoder

pytestmark = pytest.mark.vision

# torchvision's classifier of each model (its documentation's layout, written out here rather than derived)
CLASSIFIERS = [
    ("resnet18", "fc"),
    ("regnet_y_400mf", "fc"),
    ("densenet121", "classifier"),
    ("mobilenet_v3_small", "classifier.3"),
    ("efficientnet_b0", "classifier.1"),
    ("convnext_tiny", "classifier.2"),
    ("swin_t", "head"),
    ("vit_b_16", "heads.head"),
    ("googlenet", "fc"),  # auxiliary classifiers aux1, aux2 in the full model
    ("inception_v3", "fc"),  # auxiliary classifier AuxLogits; needs ≥ 75 px
]


def _saved_model(name: str, path, seed: int = 0, **kwargs) -> nn.Module:
    import torchvision.models

    torch.manual_seed(seed)
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    torch.save(model.state_dict(), path)  # what the README tells a user to save: the full model's state dict
    return model


@pytest.mark.parametrize(("model", "classifier"), CLASSIFIERS)
def test_the_backbone_gives_what_the_models_own_classifier_reads(model, classifier, tmp_path):
    """The full model (auxiliary classifiers included), saved; the encoder built from that file. In eval mode the
    model's own classifier applied to our backbone's features gives the model's logits; in training mode the
    encoder gives one embedding per image (no auxiliary outputs)."""
    size = 96 if model == "inception_v3" else 32
    full = _saved_model(
        model, tmp_path / "w.pth", **({"image_size": size} if model.startswith("vit") else {})
    )
    enc = build_image_encoder(f"torchvision:{model}", 16, image_size=size, weights=tmp_path / "w.pth")
    head = full.get_submodule(classifier)
    assert isinstance(head, nn.Linear) and enc.head.in_features == head.in_features
    full.eval(), enc.eval()
    x = torch.randn(3, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        features = enc.backbone(x)
        torch.testing.assert_close(head(features), full(x), rtol=1e-4, atol=1e-5)
        assert enc(x).shape == (3, 16)
    # the backbone's parameters are the file's; nothing of the classifiers is left in it
    own = dict(enc.backbone.state_dict())
    saved = torch.load(tmp_path / "w.pth", weights_only=True)
    aux = {k for k in saved if k.split(".")[0] in ("aux1", "aux2", "AuxLogits")}
    assert bool(aux) == (model in ("googlenet", "inception_v3"))
    assert set(saved) - set(own) == {f"{classifier}.weight", f"{classifier}.bias", *aux}
    assert all(torch.equal(own[k], saved[k]) for k in own)
    assert enc.train()(x).shape == (3, 16)


@pytest.mark.parametrize("model", ["resnet18", "vit_tiny_patch16_224", "convnext_atto"])
def test_a_timm_backbone_gives_what_the_models_own_classifier_reads(model, tmp_path):
    """timm (the other half of the `vision` extra): the full model saved, the encoder built from the file; its
    pooled features through the model's own classifier are the model's logits."""
    import timm

    torch.manual_seed(0)
    full = timm.create_model(model, pretrained=False, **({"img_size": 32} if model.startswith("vit") else {}))
    torch.save(full.state_dict(), tmp_path / "w.pth")
    enc = build_image_encoder(f"timm:{model}", 16, image_size=32, weights=tmp_path / "w.pth")
    full.eval(), enc.eval()
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(full.get_classifier()(enc.backbone(x)), full(x), rtol=1e-4, atol=1e-5)
    assert enc.train()(x).shape == (3, 16)


def test_another_architectures_weights_are_refused_by_key(tmp_path):
    _saved_model("resnet34", tmp_path / "r34.pth")
    with pytest.raises(
        ValueError, match=r"r34.pth does not fit the backbone \(unexpected: layer1.2.bn1.bias"
    ):
        build_image_encoder("torchvision:resnet18", 8, weights=tmp_path / "r34.pth")


def test_embed_writes_torchvisions_own_features(colours, tmp_path):  # noqa: F811
    reference = _saved_model("resnet18", tmp_path / "r18.pth", seed=3)
    out = tmp_path / "feats"
    assert (
        main(
            [
                "embed",
                "--data",
                str(colours),
                "--out",
                str(out),
                "--image-encoder",
                "torchvision:resnet18",
                "--image-weights",
                str(tmp_path / "r18.pth"),
                "--image-size",
                "32",
            ]
        )
        == 0
    )
    reference.fc = nn.Identity()
    reference.eval()
    for split in ("train", "val", "test"):
        with torch.no_grad():
            want = reference(views_of(read_split(colours, split), 32)).numpy()
        got = np.asarray(read_split(out, split).column("image").to_pylist(), dtype=np.float32)
        assert got.shape == (len(want), 512)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_train_on_larger_images_picks_a_resnet(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for c in range(3):
        (tmp_path / "src" / f"c{c}").mkdir(parents=True)
        for k in range(8):
            Image.fromarray(rng.integers(0, 255, (80, 96, 3)).astype(np.uint8)).save(
                tmp_path / "src" / f"c{c}" / f"{k}.png"
            )
    data = convert_image_folder(
        tmp_path / "src", tmp_path / "data", split_by="image", val_fraction=0.25, test_fraction=0.25
    )
    assert main(["train", "--data", str(data), "--print-config"]) == 0
    out = capsys.readouterr()
    assert (
        "median 80×96 colour: a ResNet-18 (no pretrained weights unless model.image_weights=) on 80 px crops"
        in out.err
    )
    assert "image_encoder: torchvision:resnet18" in out.out and "image_size: 80" in out.out


def test_the_vsepp_finetune_preset_runs_on_a_resnet_from_a_weights_file(shapes, tmp_path, capsys):  # noqa: F811
    """The preset's recipe, shortened: backbone frozen in epoch 1 (its weights stay the file's, BatchNorm's
    statistics follow the data), unfrozen in epoch 2 at the decayed LR."""
    _saved_model("resnet18", tmp_path / "r18.pth", seed=4)
    runs = tmp_path / "runs"
    assert (
        main(
            [
                "train",
                "--data",
                str(shapes),
                "--preset",
                "vsepp-finetune",
                "model.image_encoder=torchvision:resnet18",
                f"model.image_weights={tmp_path / 'r18.pth'}",
                "data.image_size=32",
                "model.embed_dim=32",
                "model.word_dim=16",
                "train.epochs=2",
                "train.freeze_backbone_epochs=1",
                "train.lr_decay_epoch=1",
                "train.batch_size=24",
                "train.num_workers=0",
                "train.min_steps=0",
                "eval.folds=1",
                f"train.storage_path={runs}",
                "train.run_name=ft",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "epoch 1/2: backbone frozen" in printed and "epoch 2/2: backbone unfrozen" in printed
    saved = torch.load(tmp_path / "r18.pth", weights_only=True)
    checkpoints = sorted((runs / "ft").glob("checkpoint_*"))
    assert len(checkpoints) == 2
    first, second = (load_checkpoint(c)[0]["model"] for c in checkpoints)
    prefix = next(k for k in first if k.endswith("backbone.conv1.weight")).removesuffix("conv1.weight")
    weights = [k for k in saved if not k.startswith("fc.") and "running_" not in k and "num_batches" not in k]
    assert all(torch.equal(first[prefix + k], saved[k]) for k in weights)
    assert all(not torch.equal(second[prefix + k], saved[k]) for k in weights)
    assert not torch.equal(first[prefix + "bn1.running_mean"], saved["bn1.running_mean"])
    # the LR epoch 2 trains at (saved after epoch 1's schedule step): 2e-4 × 0.1 for the whole model at the switch
    lrs = [g["lr"] for g in load_checkpoint(checkpoints[0])[0]["optimizer"]["param_groups"]]
    assert lrs == [pytest.approx(2e-5)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ray_workers_fine_tune_a_resnet_under_ddp(ray_cluster, shapes, tmp_path):  # noqa: F811
    """Two Ray Train workers (DDP over gloo: BatchNorm buffers broadcast from rank 0 at each forward), the
    backbone frozen in epoch 1: its weights are still the file's after it and trained after epoch 2."""
    from raydist.config import load_config
    from raydist.data import dataset_task
    from raydist.train.trainer import run_training

    _saved_model("resnet18", tmp_path / "r18.pth", seed=5)
    cfg = load_config(
        "vsepp-finetune",
        overrides={
            "data.path": str(shapes),
            "model.image_encoder": "torchvision:resnet18",
            "data.image_size": 32,
            "model.image_weights": str(tmp_path / "r18.pth"),
            "model.embed_dim": 32,
            "model.word_dim": 16,
            "train.epochs": 2,
            "train.freeze_backbone_epochs": 1,
            "train.lr_decay_epoch": 1,
            "train.batch_size": 12,
            "train.num_workers": 2,
            "eval.folds": 1,
            "train.storage_path": str(tmp_path / "runs"),
            "train.run_name": "ddp",
        },
        task_of=dataset_task,
    )
    outcome = run_training(cfg)
    assert outcome.test_metrics["rsum"] > 0
    checkpoints = run_checkpoints(outcome.run_dir)
    first, second = (load_checkpoint(c)[0]["model"] for c in checkpoints)
    saved = torch.load(tmp_path / "r18.pth", weights_only=True)
    prefix = next(k for k in first if k.endswith("backbone.conv1.weight")).removesuffix("conv1.weight")
    weights = [k for k in saved if not k.startswith("fc.") and "running_" not in k and "num_batches" not in k]
    assert all(torch.equal(first[prefix + k], saved[k]) for k in weights)
    assert all(not torch.equal(second[prefix + k], saved[k]) for k in weights)
