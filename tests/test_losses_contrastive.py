"""The shipped contrastive loss kinds (raydist/losses/contrastive.py, ``loss.kind=infonce|siglip``): loss and
gradients (encoder, logit scale, SigLIP's bias) in the Matryoshka sum on 2 gloo workers equal one process on the
concatenated batch, and both equal a float64 computation written here with loops; SigLIP's blocks of keys
change nothing; the options are config keys of the pairs task only."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from raydist.config import Config, ConfigError, apply_overrides
from raydist.distributed import NegativeSet, gather_step
from raydist.distributed.spawn import spawn
from raydist.losses import LossInputs, get_loss, nested_rank_loss
from raydist.losses.contrastive import siglip_loss
from raydist.tasks import DataInfo, check_task_config

WORLD, ROWS, FEATURES, DIM = 2, 5, 4, 6
NESTING, WEIGHTS = [3, 6], [0.5, 2.0]
# image 1 has a caption on each rank (rows 1 and 6), image 3 two on rank 0: never each other's negatives
IMAGE_IDS = torch.tensor([0, 1, 3, 3, 4, 5, 1, 7, 8, 9])
KINDS = ("infonce", "siglip")
# starting values away from the defaults, so that the scale and the bias are checked where the terms are not flat
OVERRIDES = {
    "infonce": {"loss.kind": "infonce", "loss.temperature_init": 0.5},
    "siglip": {"loss.kind": "siglip", "loss.scale_init": 3.0, "loss.bias_init": -1.5},
}


class PairEmbedder(nn.Module):
    """Two float64 linear maps (image, caption) and the loss kind's logit scale, the same weights every call."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.image, self.text = nn.Linear(FEATURES, DIM), nn.Linear(FEATURES, DIM)
        cfg = apply_overrides(Config(), OVERRIDES[kind])
        loss = get_loss(kind)(cfg)
        self.add_module(loss.module_name, loss.module(None))
        self.double()

    def forward(self, x_img: Tensor, x_cap: Tensor) -> tuple[Tensor, Tensor]:
        return self.image(x_img), self.text(x_cap)


def inputs() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(3)
    return (torch.randn(WORLD * ROWS, FEATURES, generator=g, dtype=torch.float64) for _ in range(2))


def kind_loss(kind: str, model: nn.Module, x_img: Tensor, x_cap: Tensor, ids: Tensor, rows: Tensor) -> Tensor:
    """The loss kind in the Matryoshka sum over the gathered batch, as the pairs task computes it."""
    net = model.module if isinstance(model, DistributedDataParallel) else model
    loss = get_loss(kind)(apply_overrides(Config(), OVERRIDES[kind]))
    img, cap = model(x_img, x_cap)  # through DDP's forward: its hooks average the gradients
    batch = gather_step({"img": img, "cap": cap}, {"image_id": ids, "sample_id": rows})
    extras = dict(getattr(net, loss.module_name).named_parameters())
    negatives = NegativeSet(torch.arange(len(ids)), None)
    return nested_rank_loss(
        loss.loss, LossInputs(batch, negatives, extras, 0, 0, {}), ("img", "cap"), NESTING, WEIGHTS
    )


def grads_of(model: nn.Module) -> dict[str, Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def loops(kind: str, model: PairEmbedder, x_img: Tensor, x_cap: Tensor) -> Tensor:
    """``Σ_m c_m · L(normalize(z[:, :m]))`` on all rows by loops over (image, caption) pairs, float64: InfoNCE
    as CLIP's two cross-entropies over the other images' captions (and images), SigLIP as the sum of
    −log σ(±(t·s + b)) over every pair of different images and every own pair, divided by the batch."""
    n, ids, total = len(IMAGE_IDS), IMAGE_IDS.tolist(), 0.0
    t = model.logit_scale.log_scale.exp()
    for m, c in zip(NESTING, WEIGHTS, strict=True):
        img, cap = model.image(x_img)[:, :m], model.text(x_cap)[:, :m]
        img, cap = img / img.norm(dim=1, keepdim=True), cap / cap.norm(dim=1, keepdim=True)
        value = 0.0
        for i in range(n):
            keys = [j for j in range(n) if j == i or ids[j] != ids[i]]
            if kind == "infonce":
                for q, k in ((img, cap), (cap, img)):
                    logits = [t * (q[i] @ k[j]) for j in keys]
                    value = value - t * (q[i] @ k[i]) + torch.log(sum(torch.exp(v) for v in logits))
            else:
                b = model.logit_scale.bias
                for j in keys:
                    z = 1.0 if j == i else -1.0
                    value = value - torch.log(torch.sigmoid(z * (t * (img[i] @ cap[j]) + b)))
        total = total + c * value / (2 * n if kind == "infonce" else n)
    return total


def _worker(rank: int, init_file: str, x_img: Tensor, x_cap: Tensor, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    mine = slice(rank * ROWS, (rank + 1) * ROWS)
    results = {}
    for kind in KINDS:
        model = PairEmbedder(kind)
        ddp = DistributedDataParallel(model)
        rows = torch.arange(WORLD * ROWS)[mine]
        loss = kind_loss(kind, ddp, x_img[mine], x_cap[mine], IMAGE_IDS[mine], rows)
        loss.backward()
        results[kind] = {"loss": loss.item(), "grads": grads_of(model)}
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def one_process(kind: str) -> tuple[Tensor, dict[str, Tensor], Tensor, dict[str, Tensor]]:
    """The kind on the concatenated batch in one process, and the loops; each with its gradients."""
    x_img, x_cap = inputs()
    model = PairEmbedder(kind)
    got = kind_loss(kind, model, x_img, x_cap, IMAGE_IDS, torch.arange(WORLD * ROWS))
    got.backward()
    reference = PairEmbedder(kind)
    want = loops(kind, reference, x_img, x_cap)
    want.backward()
    return got, grads_of(model), want, grads_of(reference)


@pytest.mark.parametrize("kind", KINDS)
def test_one_process_matches_the_float64_loops(kind) -> None:
    got, got_grads, want, want_grads = one_process(kind)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert got_grads.keys() == want_grads.keys() >= {"logit_scale.log_scale", "image.weight", "text.weight"}
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-10, atol=1e-13, msg=name)
        assert grad.abs().max() > 1e-4, name  # every parameter is reached, the scale and bias included
    if kind == "siglip":
        assert "logit_scale.bias" in got_grads


@pytest.mark.slow
@pytest.mark.gloo
@pytest.mark.timeout(120)
def test_two_gloo_workers_equal_one_process_on_the_concatenated_batch(tmp_path) -> None:
    """After DDP's average both ranks hold the one-process gradients (encoders, scale, bias) to 1e-6 relative,
    and the mean over ranks of the returned values is the one-process loss."""
    x_img, x_cap = inputs()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spawn(_worker, (str(tmp_path / "init"), x_img, x_cap, str(tmp_path)), nprocs=WORLD)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for kind in KINDS:
        want, want_grads, loops_value, _ = one_process(kind)
        assert sum(r[kind]["loss"] for r in ranks) / WORLD == pytest.approx(want.item(), rel=1e-6)
        assert want.item() == pytest.approx(loops_value.item(), rel=1e-12)
        for rank in ranks:
            for name, grad in want_grads.items():
                torch.testing.assert_close(rank[kind]["grads"][name], grad, rtol=1e-6, atol=1e-9, msg=name)


def test_siglip_blocks_of_keys_change_nothing() -> None:
    """The sigmoid loss walked in key blocks of 1, 3 (a ragged last block) and all keys: the same value and
    gradients (queries, keys, scale, bias) as the dense score matrix through plain autograd."""
    g = torch.Generator().manual_seed(7)
    img, cap = (
        nn.functional.normalize(torch.randn(7, 4, generator=g, dtype=torch.float64), dim=1) for _ in "ic"
    )
    ids = torch.tensor([0, 1, 1, 2, 3, 4, 5])
    results = []
    for block in (None, 1, 3, 7):
        leaves = [
            x.clone().requires_grad_() for x in (img, cap, torch.tensor(math.log(4.0)), torch.tensor(-2.0))
        ]
        rows = torch.arange(7)
        batch = gather_step({"img": leaves[0], "cap": leaves[1]}, {"image_id": ids})
        if block is None:  # dense: every pair at once
            u = leaves[2].exp() * leaves[0] @ leaves[1].T + leaves[3]
            z = (rows[:, None] == rows[None, :]).double() * 2 - 1
            keep = (rows[:, None] == rows[None, :]) | (ids[:, None] != ids[None, :])
            value = -torch.nn.functional.logsigmoid(z * u)[keep].sum() / 7
        else:
            value = siglip_loss(batch, log_scale=leaves[2], bias=leaves[3], block=block)
        results.append((value, torch.autograd.grad(value, leaves)))
    for value, grads in results[1:]:
        torch.testing.assert_close(value, results[0][0], rtol=1e-13, atol=0)
        for got, want in zip(grads, results[0][1], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-14)


def test_the_options_are_pairs_keys_with_their_defaults() -> None:
    cfg = Config()
    assert (cfg.loss.temperature_init, cfg.loss.scale_init, cfg.loss.bias_init) == (0.07, 10.0, -10.0)
    model = PairEmbedder("infonce")
    assert model.logit_scale.log_scale.item() == pytest.approx(math.log(1 / 0.5))
    frozen = get_loss("siglip")(
        apply_overrides(cfg, {"loss.kind": "siglip", "loss.learn_temperature": False})
    )
    scale = frozen.module(None)
    assert scale.log_scale.item() == pytest.approx(math.log(10)) and scale.bias.item() == -10.0
    assert not any(p.requires_grad for p in scale.parameters())
    pairs, labels = DataInfo("pairs", FEATURES), DataInfo("labels", FEATURES, 3)
    check_task_config(apply_overrides(cfg, {"loss.kind": "siglip", "loss.bias_init": -5}), pairs)
    with pytest.raises(
        ConfigError, match="loss.bias_init=-5.0: the pairs task reads it only with loss.kind siglip"
    ):
        check_task_config(apply_overrides(cfg, {"loss.kind": "infonce", "loss.bias_init": -5}), pairs)
    with pytest.raises(ConfigError, match="loss.kind=infonce: the labels task trains"):
        check_task_config(apply_overrides(cfg, {"loss.kind": "infonce"}), labels)
    with pytest.raises(ConfigError, match="loss.temperature_init=0"):
        apply_overrides(cfg, {"loss.temperature_init": 0})
