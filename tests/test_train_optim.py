"""raydist/train/optim.py: the default optimizer and schedule equal today's Adam + StepLR bit for bit; parameter
groups by name (backbone LR multiplier, no weight decay on biases and norm layers); warm-up + cosine / step decay
against the closed form; bad values refused naming the key; the VSE++ fine-tuning preset; and, through the loop
without Ray (LocalRuntime), a frozen backbone that starts training at the switch epoch, resumed before and after
the switch exactly as an uninterrupted run (tolerance 1e-6 on every weight)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from raydist.checkpoint import load_checkpoint
from raydist.config import ConfigError, from_dict, load_config
from raydist.converters.image_folder import convert_image_folder
from raydist.data import dataset_task
from raydist.models.image_encoders import BackboneEncoder
from raydist.models.text_encoders import PretrainedTextEncoder
from raydist.models.vse import build_model
from raydist.tasks import DataInfo, build_task
from raydist.train.hooks import Hook
from raydist.train.local import LocalRuntime
from raydist.train.loop import Trainables, run_loop
from raydist.train.optim import build_optimizer, build_schedule, parameter_groups
from raydist.train.plan import step_plan

pytestmark = pytest.mark.timeout(120)


def _group_names(model: nn.Module, groups: list[dict]) -> dict[str, list[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {g["name"]: [names[id(p)] for p in g["params"]] for g in groups}


def test_default_is_adam_with_a_per_epoch_steplr_bit_for_bit():
    cfg = from_dict({"train": {"lr": 0.01, "lr_decay_epoch": 2, "lr_decay_factor": 0.5}})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    ref = copy.deepcopy(model)
    parts = Trainables.build(cfg, model, torch.device("cpu"), steps_per_epoch=3)
    assert type(parts.optimizer) is torch.optim.Adam and len(parts.optimizer.param_groups) == 1
    assert parts.optimizer.param_groups[0]["params"] == list(model.parameters())
    assert isinstance(parts.scheduler, torch.optim.lr_scheduler.StepLR)
    optimizer = torch.optim.Adam(
        ref.parameters(), lr=0.01
    )  # what the loop built before raydist/train/optim.py
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    x = torch.randn(5, 3, 4)
    for epoch in range(5):
        for step in range(3):
            for net, opt in ((model, parts.optimizer), (ref, optimizer)):
                opt.zero_grad(set_to_none=True)
                net(x[step]).pow(2).sum().backward()
                opt.step()
            parts.scheduler.after_step()
        parts.scheduler.after_epoch()
        scheduler.step()
        assert parts.scheduler.get_last_lr() == scheduler.get_last_lr() == [0.01 * 0.5 ** ((epoch + 1) // 2)]
    for mine, theirs in zip(model.parameters(), ref.parameters(), strict=False):
        assert torch.equal(mine, theirs)
    assert parts.scheduler.state_dict() == scheduler.state_dict()  # checkpoints resume across the two


def test_vse_parameter_groups_by_name():
    cfg = from_dict(
        {
            "model": {"image_encoder": "small-cnn", "embed_dim": 16, "word_dim": 8},
            "train": {"lr": 1e-3, "weight_decay": 0.05, "backbone_lr_mult": 0.1},
        }
    )
    model = build_model(cfg, None, 12, channels=3, image_size=8)
    groups = parameter_groups(model, cfg.train)
    trunk = "image.encoder.backbone.features"
    assert _group_names(model, groups) == {
        "decay": [
            "image.encoder.head.weight",
            "text.embed.weight",
            "text.rnn.weight_ih_l0",
            "text.rnn.weight_hh_l0",
        ],
        "no_decay": ["image.encoder.head.bias", "text.rnn.bias_ih_l0", "text.rnn.bias_hh_l0"],
        "backbone": [f"{trunk}.{i}.weight" for i in (0, 4, 8)],  # the convolutions
        "backbone_no_decay": [
            f"{trunk}.{i}.{w}" for i in (1, 5, 9) for w in ("weight", "bias")
        ],  # GroupNorms
    }
    settings = {g["name"]: (g["lr"], g["weight_decay"]) for g in groups}
    assert settings == {
        "decay": (1e-3, 0.05),
        "no_decay": (1e-3, 0.0),
        "backbone": (pytest.approx(1e-4), 0.05),
        "backbone_no_decay": (pytest.approx(1e-4), 0.0),
    }


def test_batchnorm_conv_bias_and_a_pretrained_text_backbone():
    train = from_dict({"train": {"weight_decay": 0.1, "backbone_lr_mult": 0.5}}).train
    image = BackboneEncoder(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten()), 4, 6)
    text = PretrainedTextEncoder(nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4)), 4, 6)
    model = nn.ModuleDict({"image": image, "text": text, "extra": nn.Linear(6, 6)})
    assert _group_names(model, parameter_groups(model, train)) == {
        "decay": ["image.head.weight", "text.proj.weight", "extra.weight"],
        "no_decay": ["image.head.bias", "text.proj.bias", "extra.bias"],
        "backbone": ["image.backbone.0.weight", "text.backbone.0.weight"],
        "backbone_no_decay": [
            "image.backbone.0.bias",
            "image.backbone.1.weight",
            "image.backbone.1.bias",
            "text.backbone.1.weight",
            "text.backbone.1.bias",
        ],
    }


def test_adamw_decays_only_the_decay_groups_at_their_own_lr():
    """With zero gradients an AdamW step only decays: p ← p (1 − lr_g · wd_g)."""
    train = from_dict(
        {"train": {"optimizer": "adamw", "lr": 0.1, "weight_decay": 0.5, "backbone_lr_mult": 0.2}}
    ).train
    model = BackboneEncoder(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4)), 4, 2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = build_optimizer(model, train)
    assert type(optimizer) is torch.optim.AdamW
    (0 * sum(p.sum() for p in model.parameters())).backward()
    optimizer.step()
    want = {"backbone.0.weight": 1 - 0.1 * 0.2 * 0.5, "head.weight": 1 - 0.1 * 0.5}  # the rest: not decayed
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), before[name] * want.get(name, 1.0), rtol=0, atol=1e-7)
    single = build_optimizer(model, from_dict({"train": {"optimizer": "adamw"}}).train)
    assert [g["weight_decay"] for g in single.param_groups] == [0.0]  # not AdamW's own default of 0.01


@pytest.mark.parametrize("kind", ["cosine", "step"])
def test_warmup_then_decay_matches_the_closed_form(kind):
    spe, epochs, warmup, lr = 5, 4, 3, 0.1
    train = from_dict(
        {
            "train": {
                "lr": lr,
                "epochs": epochs,
                "lr_schedule": kind,
                "warmup_steps": warmup,
                "lr_decay_epoch": 2,
                "lr_decay_factor": 0.3,
                "backbone_lr_mult": 0.5,
            }
        }
    ).train
    model = BackboneEncoder(nn.Linear(3, 4), 4, 2)
    optimizer = build_optimizer(model, train)
    schedule = build_schedule(optimizer, train, spe)
    total, seen = epochs * spe, []
    for epoch in range(epochs):
        for i in range(spe):
            s = epoch * spe + i
            warm = (s + 1) / warmup if s < warmup else 1.0
            if kind == "cosine":
                decay = (1 + math.cos(math.pi * max(s - warmup, 0) / (total - warmup))) / 2
            else:
                decay = 0.3 ** (epoch // 2)
            for group in optimizer.param_groups:
                mult = 0.5 if group["name"].startswith("backbone") else 1.0
                assert group["lr"] == pytest.approx(lr * mult * warm * decay, rel=1e-12, abs=1e-15), (
                    s,
                    group["name"],
                )
            seen.append(optimizer.param_groups[0]["lr"])
            schedule.after_step()
        schedule.after_epoch()
    assert seen[0] == pytest.approx(lr / warmup) and max(seen) == pytest.approx(lr)
    if kind == "cosine":
        assert seen == sorted(seen[:warmup]) + sorted(seen[warmup:], reverse=True) and seen[-1] < 0.01 * lr


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"train.optimizer": "sgd"}, "train.optimizer: expected 'adam' or 'adamw'"),
        ({"train.weight_decay": -0.1}, "train.weight_decay=-0.1: must be >= 0"),
        ({"train.lr_schedule": "linear"}, "train.lr_schedule: expected 'step' or 'cosine'"),
        ({"train.warmup_steps": -1}, "train.warmup_steps=-1: must be >= 0"),
        ({"train.warmup_steps": "abc"}, "train.warmup_steps: expected an integer"),
        ({"train.backbone_lr_mult": 0}, "train.backbone_lr_mult=0: must be > 0"),
        ({"train.freeze_backbone_epochs": -2}, "train.freeze_backbone_epochs=-2: must be >= 0"),
        ({"train.freeze_backbone_epochs": 2}, "train.freeze_backbone_epochs=2: the model has no backbone"),
        ({"train.backbone_lr_mult": 0.1}, "train.backbone_lr_mult=0.1: the model has no backbone"),
    ],
)
def test_bad_values_are_refused_naming_the_key(overrides, says):
    with pytest.raises(ConfigError) as info:
        load_config("tiny", overrides=overrides)
    assert says in str(info.value)


def test_backbone_keys_fit_a_model_with_a_backbone():
    for encoders in ({"model.image_encoder": "small-cnn"}, {"model.text_encoder": "hf:some/folder"}):
        cfg = load_config(
            "tiny", overrides={**encoders, "train.freeze_backbone_epochs": 2, "train.backbone_lr_mult": 0.1}
        )
        assert (cfg.train.freeze_backbone_epochs, cfg.train.backbone_lr_mult) == (2, 0.1)


def test_vsepp_finetune_preset():
    cfg = load_config("vsepp-finetune")
    t = cfg.train
    assert cfg.model.image_encoder == "torchvision:resnet152" and (t.lr, t.epochs) == (2e-4, 30)
    assert t.freeze_backbone_epochs == t.lr_decay_epoch == 15 and t.lr_decay_factor == 0.1
    assert (cfg.loss.hardest, cfg.eval.folds, cfg.model.word_dim) == (True, 5, 300)  # its tasks.pairs block
    small = load_config(
        "vsepp-finetune", overrides={"model.image_encoder": "small-cnn", "train.freeze_backbone_epochs": 3}
    )
    assert small.train.freeze_backbone_epochs == 3


# ---- through the loop (LocalRuntime: no Ray) --------------------------------------------------------------


@pytest.fixture(scope="module")
def colours(tmp_path_factory):
    """An encoded labels dataset: 3 colour classes of 8×8 PNGs, 16 each; train 24 images (3 steps of 8)."""
    root = tmp_path_factory.mktemp("optim-colours")
    rng = np.random.default_rng(0)
    for c, rgb in enumerate(((220, 30, 30), (30, 200, 40), (40, 60, 230))):
        folder = root / "src" / f"c{c}"
        folder.mkdir(parents=True)
        for k in range(16):
            img = rng.integers(80, 160, (8, 8, 3)).astype(np.uint8)
            img[2:6, 2:6] = rgb
            Image.fromarray(img).save(folder / f"{k}.png")
    return convert_image_folder(
        root / "src", root / "data", split_by="image", val_fraction=0.25, test_fraction=0.25
    )


# the image encoders the fine-tuning tests run on: small-cnn (GroupNorm, no buffers) everywhere, and a real
# torchvision ResNet-18 (BatchNorm: running statistics that move while the backbone is frozen) where it imports
ENCODERS = [
    pytest.param({"model.image_encoder": "small-cnn"}, id="small-cnn"),
    pytest.param(
        {"model.image_encoder": "torchvision:resnet18", "data.image_size": 32},
        id="resnet18",
        marks=pytest.mark.vision,
    ),
]


def _train(data, run_dir, *, hooks=(), resume=None, **overrides):
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(data),
            "model.image_encoder": "small-cnn",
            "train.num_workers": 0,
            "train.batch_size": 8,
            "train.epochs": 4,
            "train.lr": 0.003,
            "train.freeze_backbone_epochs": 2,
            "data.flip": False,
            **overrides,
        },
        task_of=dataset_task,
    )
    task = build_task(cfg, DataInfo.from_dataset(data))
    plan = step_plan(cfg, task.info.task)
    runtime = LocalRuntime(cfg, task, plan, run_dir)
    out = run_loop(cfg, task, runtime, plan, hooks=list(hooks), resume_from=resume)
    return cfg, task, runtime, out


def _weights(folder) -> dict[str, torch.Tensor]:
    return load_checkpoint(folder)[0]["model"]


def _is_backbone(name: str) -> bool:
    return ".backbone." in name


class BackboneGrads(Hook):
    """Per step: the epoch and the backbone's gradient norm after backward (None: no gradient)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float | None]] = []

    def after_backward(self, ctx, model) -> None:
        grads = [p.grad for n, p in model.named_parameters() if _is_backbone(n)]
        if any(g is None for g in grads):
            assert all(g is None for g in grads)
            self.seen.append((ctx.epoch, None))
            return
        self.seen.append(
            (ctx.epoch, float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))))
        )


@pytest.mark.parametrize("encoder", ENCODERS)
def test_frozen_backbone_has_no_gradient_and_keeps_its_weights_until_the_switch(
    colours, tmp_path, capsys, encoder
):
    hook = BackboneGrads()
    cfg, task, runtime, out = _train(colours, tmp_path / "run", hooks=[hook], **encoder)
    assert (
        out["global_step"] == 12 and len(runtime.checkpoints) == 4
    )  # 4 epochs × 3 steps, one checkpoint each
    assert [e for e, norm in hook.seen if norm is None] == [0, 0, 0, 1, 1, 1]
    assert all(norm > 0 for e, norm in hook.seen if e >= 2) and len(hook.seen) == 12
    torch.manual_seed(cfg.train.seed)  # the loop's initial weights
    initial = task.build_model().state_dict()
    epochs = [_weights(c) for c in runtime.checkpoints]
    names = list(dict(task.build_model().named_parameters()))
    backbone = [n for n in names if _is_backbone(n)]
    assert backbone and all(torch.equal(epochs[e][n], initial[n]) for e in (0, 1) for n in backbone)
    assert all(not torch.equal(epochs[2][n], initial[n]) for n in backbone)
    # buffers (BatchNorm's running mean and variance) are no parameters: they follow the data while frozen
    stats = [n for n in initial if _is_backbone(n) and n.endswith(("running_mean", "running_var"))]
    assert bool(stats) == (encoder["model.image_encoder"] != "small-cnn")
    assert all(not torch.equal(epochs[0][n], initial[n]) for n in stats)
    assert not torch.equal(epochs[0]["encoder.encoder.head.weight"], initial["encoder.encoder.head.weight"])
    # Adam holds no state for the frozen backbone before the switch (one group: indices of model.parameters())
    trunk = {i for i, n in enumerate(names) if _is_backbone(n)}
    optimizer_states = [set(load_checkpoint(c)[0]["optimizer"]["state"]) for c in runtime.checkpoints]
    assert not trunk & optimizer_states[1] and trunk <= optimizer_states[2]
    printed = capsys.readouterr().out
    assert "epoch 1/4: backbone frozen" in printed and "epoch 3/4: backbone unfrozen" in printed


@pytest.mark.parametrize("encoder", ENCODERS)
def test_resume_before_and_after_the_switch_equals_an_uninterrupted_run(colours, tmp_path, encoder):
    """Warm-up + cosine (per-step state), AdamW with decay, a backbone at LR × 0.5 frozen for 2 epochs;
    checkpoints every 2 steps, so the runs resume mid-epoch: step 4 (epoch 2, frozen) and step 8 (epoch 3)."""
    options = {
        "train.lr_schedule": "cosine",
        "train.warmup_steps": 4,
        "train.optimizer": "adamw",
        "train.weight_decay": 0.01,
        "train.backbone_lr_mult": 0.5,
        "train.checkpoint_every": 2,
        **encoder,
    }
    _, task, whole, _ = _train(colours, tmp_path / "whole", **options)
    by_step = {load_checkpoint(c)[0]["loop"]["global_step"]: c for c in whole.checkpoints}
    assert sorted(by_step) == [2, 3, 4, 6, 8, 9, 10, 12]
    # the LR of every group after 8 steps: warm-up over, cosine at (8 − 4) / (12 − 4) = ½ → factor ½
    lrs = {g["name"]: g["lr"] for g in load_checkpoint(by_step[8])[0]["optimizer"]["param_groups"]}
    assert lrs["backbone"] == pytest.approx(0.003 * 0.5 * 0.5) and lrs["decay"] == pytest.approx(0.003 * 0.5)
    final = _weights(by_step[12])
    for step in (4, 8):
        _, _, resumed, out = _train(colours, tmp_path / f"from-{step}", resume=str(by_step[step]), **options)
        assert out["resumed_at"] == [step]
        again = {load_checkpoint(c)[0]["loop"]["global_step"]: c for c in resumed.checkpoints}
        if step == 4:  # resumed while frozen: the backbone's weights are still the initial ones after epoch 2
            for name, _ in task.build_model().named_parameters():
                if _is_backbone(name):
                    assert torch.equal(_weights(again[6])[name], _weights(by_step[2])[name])
        got = _weights(again[12])
        for name in final:
            torch.testing.assert_close(got[name], final[name], rtol=0, atol=1e-6)
        want_groups = load_checkpoint(by_step[12])[0]["optimizer"]["param_groups"]
        got_groups = load_checkpoint(again[12])[0]["optimizer"]["param_groups"]
        assert [g["lr"] for g in got_groups] == [g["lr"] for g in want_groups]
