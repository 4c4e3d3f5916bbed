"""Encoders under DDP with cross-worker negatives: 2 gloo processes, each holding half of a batch, give the
parameter gradients of the single-process loss on the concatenated batch (float64, exact up to rounding), for
the transformer text encoder (each half padded only to its own longest caption) and for the small CNN image
encoder over raw pixels (GroupNorm: no batch statistics, so a row's embedding never depends on its rank).
Uses the harness of test_distributed_negatives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_distributed_negatives import dense_loss
from torch.nn.parallel import DistributedDataParallel

from raydist.config import LossSection, load_config
from raydist.distributed.spawn import spawn
from raydist.losses import step_ranking_loss
from raydist.models import build_model

WORLD, ROWS, FEATURES, VOCAB, MAX_LEN = 2, 8, 6, 30, 10
LENGTHS = [3, 10, 2, 6, 4, 5, 2, 7]  # rank 0 pads to 10 tokens, rank 1 to 7, the single process to 10


CHANNELS, SIDE = 3, 9  # the image case's raw pixels: 3 × 9 × 9 (odd: the ceil-mode pools see a ragged edge)
# case → (config overrides, a parameter that must receive a gradient)
CASES = {
    "transformer-text": ({}, "encoder.layers.1.self_attn.in_proj_weight"),
    "small-cnn-image": ({"model.image_encoder": "small-cnn"}, "features.8.weight"),
}


def _model(case: str) -> torch.nn.Module:
    cfg = load_config(
        "tiny",
        overrides={
            "model.text_encoder": "transformer",
            "model.text_layers": 2,
            "model.text_heads": 2,
            "model.text_width": 8,
            "model.text_dropout": 0.0,
            "model.embed_dim": 6,
            "data.max_caption_len": MAX_LEN,
            **CASES[case][0],
        },
    )
    torch.manual_seed(0)
    if cfg.model.image_encoder == "linear":
        return build_model(cfg, FEATURES, VOCAB).double()
    return build_model(cfg, None, VOCAB, channels=CHANNELS, image_size=SIDE).double()


def _bank(case: str) -> dict[str, torch.Tensor]:
    """Rows 1 and 5 share an image id (on different ranks): never each other's negatives. Their features differ:
    with equal features a duplicate's hinge terms cancel in the gradient, and the mask would not show."""
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor(LENGTHS)
    tokens = torch.randint(1, VOCAB, (ROWS, MAX_LEN), generator=g)
    tokens[torch.arange(MAX_LEN)[None] >= lengths[:, None]] = 0
    image_ids = torch.tensor([0, 1, 2, 3, 4, 1, 6, 7])
    shape = (FEATURES,) if case == "transformer-text" else (CHANNELS, SIDE, SIDE)
    features = torch.randn(ROWS, *shape, generator=g, dtype=torch.float64)
    return {
        "features": features,
        "tokens": tokens,
        "lengths": lengths,
        "image_ids": image_ids,
        "sample_ids": torch.arange(100, 100 + ROWS),
    }


def _forward(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    width = int(batch["lengths"].max())  # as PairsTask.encode: padded to the batch's longest caption
    return model(batch["features"], batch["tokens"][:, :width], batch["lengths"])


def _worker(rank: int, case: str, init_file: str, state: dict, bank: dict, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    model = _model(case)
    model.load_state_dict(state)
    ddp = DistributedDataParallel(model)
    half = slice(rank * ROWS // WORLD, (rank + 1) * ROWS // WORLD)
    batch = {k: v[half] for k, v in bank.items()}
    results = {}
    for hardest in (True, False):
        ddp.zero_grad(set_to_none=True)
        img, cap = _forward(ddp, batch)
        loss = step_ranking_loss(
            img,
            cap,
            image_ids=batch["image_ids"],
            sample_ids=batch["sample_ids"],
            loss_cfg=LossSection(),
            batch_size=ROWS,
            hardest=hardest,
        )
        loss.backward()
        results[hardest] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.gloo
@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", list(CASES))
def test_ddp_gradients_match_single_process(tmp_path, case):
    model, bank = _model(case), _bank(case)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spawn(_worker, (case, str(tmp_path / "init"), model.state_dict(), bank, str(tmp_path)), nprocs=WORLD)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    names, params = zip(*model.named_parameters(), strict=False)
    assert any(n.endswith(CASES[case][1]) for n in names), names
    for hardest in (True, False):
        img, cap = _forward(model, bank)
        loss = dense_loss(img, cap, hardest=hardest, image_ids=bank["image_ids"])
        want = dict(zip(names, torch.autograd.grad(loss, params), strict=False))
        for name, expected in want.items():
            assert expected.abs().max() > 0 or name.endswith("embed.weight"), name
            for rank in ranks:
                torch.testing.assert_close(
                    rank[hardest][name], expected, rtol=1e-9, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}"
                )
    # the cross-worker duplicate's mask is visible in SH's gradients (MH's hardest negatives here are other rows)
    unmasked = dense_loss(*_forward(model, bank), hardest=False, image_ids=torch.arange(ROWS))
    gaps = [
        (g - ranks[0][False][n]).abs().max()
        for n, g in zip(names, torch.autograd.grad(unmasked, params), strict=False)
    ]
    assert max(gaps) > 1e-6
