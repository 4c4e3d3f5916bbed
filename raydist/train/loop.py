"""``train_loop_per_worker``: the per-worker training loop of DESIGN.md §3, read top to bottom.

Ray-specific calls (context, dataset shard, report, checkpoint) sit at the edges; everything else is
plain PyTorch. All ranks run the same number of equal-size steps and report the same number of times.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray.train
import ray.train.torch
import torch
from torch import nn

from raydist.config import Config, from_dict
from raydist.data import Vocab, split_arrays
from raydist.distributed import rows_per_worker, step_ranking_loss
from raydist.eval.evaluate import evaluate_arrays
from raydist.models import build_model
from raydist.train.checkpoint import (
    check_compatible,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


@dataclass
class LoopState:
    """Counters that a checkpoint carries so a resumed run continues where it stopped."""

    epoch: int = 0  # epoch in progress
    step_in_epoch: int = 0  # steps of `epoch` already done
    global_step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    resumed_at: list[int] = field(default_factory=list)  # global step of every restore


@dataclass
class Trainables:
    """What a step updates and a checkpoint saves besides the counters."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": _unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _unwrap(self.model).load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])


def say(*parts: Any, flush: bool = True) -> None:
    """Print a progress line once. (Train V2 patches ``print`` in workers to also copy each line to
    its logger, which prints every line twice on the driver; writing to the stream does not.)"""
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    if flush:
        sys.stdout.flush()


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def step_generator(seed: int, global_step: int) -> torch.Generator:
    """The generator for a step's negative-set draws: identical on every rank, seeded by (seed, step)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + global_step)


def _epoch_batches(shard: Any, rows: int, cfg: Config, epoch: int, rank: int) -> Iterator[dict[str, np.ndarray]]:
    """This worker's batches for one epoch; the local shuffle is seeded by (seed, epoch, rank)."""
    shuffle = cfg.data.shuffle_buffer
    return shard.iter_batches(
        batch_size=rows,
        batch_format="numpy",
        drop_last=True,
        local_shuffle_buffer_size=shuffle if shuffle > 0 else None,
        local_shuffle_seed=(cfg.train.seed * 7919 + epoch) * 131 + rank if shuffle > 0 else None,
    )


def _maybe_inject_fault(cfg: Config, rank: int, global_step: int, marker_dir: str) -> None:
    """Fault injection for tests: rank ``fail_rank`` exits hard once, at ``fail_at_step``."""
    t = cfg.train
    if t.fail_at_step < 0 or rank != t.fail_rank or global_step != t.fail_at_step:
        return
    marker = Path(marker_dir) / f"fault-injected-rank{rank}-step{global_step}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    say(f"[raydist] fault injection: rank {rank} exits hard at step {global_step}", flush=True)
    os._exit(1)


def train_loop_per_worker(loop_config: dict[str, Any]) -> dict[str, Any] | None:
    """Train one worker. ``loop_config``: ``cfg`` (nested dict), ``data_dir``, ``feature_dim``,
    optional ``resume_from`` (checkpoint folder) and ``marker_dir`` (fault-injection markers)."""
    cfg = from_dict(loop_config["cfg"])
    data_dir = Path(loop_config["data_dir"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    torch.manual_seed(cfg.train.seed)

    vocab = Vocab.load(data_dir / "vocab.json")
    model = build_model(cfg, loop_config["feature_dim"], len(vocab))
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.train.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(
        optimizer, step_size=cfg.train.lr_decay_epoch, gamma=cfg.train.lr_decay_factor
    )
    # fp16 needs loss scaling; with "none"/"bf16" the scaler is a pass-through.
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.train.amp == "fp16")
    parts = Trainables(model, optimizer, scheduler, scaler)
    state = LoopState()

    ray_ckpt = ray.train.get_checkpoint()
    resume_from = loop_config.get("resume_from")
    if ray_ckpt is not None:
        with ray_ckpt.as_directory() as d:
            state = _restore(d, cfg, parts)
    elif resume_from:
        state = _restore(resume_from, cfg, parts)
    model = parts.model = ray.train.torch.prepare_model(model)

    # The driver validated every shard (sha256 included) just before starting the workers.
    val = split_arrays(data_dir, "val", verify=False) if rank == 0 else None
    rows = rows_per_worker(cfg.train.batch_size, cfg.loss.negative_set_size, max(world, 1))
    shard = ray.train.get_dataset_shard("train")
    marker_dir = loop_config.get("marker_dir") or tempfile.gettempdir()

    while state.epoch < cfg.train.epochs:
        epoch = state.epoch
        hardest = cfg.loss.hardest and epoch >= cfg.loss.warmup_sh_epochs
        model.train()
        t0, seen, loss_sum, n_steps = time.perf_counter(), 0, 0.0, 0
        for i, batch in enumerate(_epoch_batches(shard, rows, cfg, epoch, rank)):
            if i < state.step_in_epoch:  # resumed mid-epoch: these steps were done before
                continue
            _maybe_inject_fault(cfg, rank, state.global_step, marker_dir)
            stats: dict[str, float] = {}
            loss = _train_step(parts, batch, vocab, cfg, hardest, state.global_step, device, stats)
            state.step_in_epoch += 1
            state.global_step += 1
            seen += rows * max(world, 1)
            loss_sum += loss
            n_steps += 1
            if rank == 0 and state.global_step % cfg.train.log_every == 0:
                rate = seen / max(time.perf_counter() - t0, 1e-9)
                extra = "".join(f" {k.split('/')[-1]} {v:.3g}" for k, v in stats.items())
                say(
                    f"[raydist] epoch {epoch + 1}/{cfg.train.epochs} step {state.global_step} "
                    f"loss {loss:.4f} samples/s {rate:.0f}{extra}",
                    flush=True,
                )
            if cfg.train.checkpoint_every and state.global_step % cfg.train.checkpoint_every == 0:
                _report(state, cfg, parts, data_dir, rank, {"train/loss": loss})
        scheduler.step()
        state.epoch += 1
        state.step_in_epoch = 0
        metrics: dict[str, Any] = {
            "epoch": state.epoch,
            "step": state.global_step,
            "train/loss": loss_sum / max(n_steps, 1),
            "train/samples_per_s": seen / max(time.perf_counter() - t0, 1e-9),
            "loss/hardest": int(hardest),
        }
        if rank == 0:
            val_metrics = evaluate_arrays(
                _unwrap(model), vocab, val, max_len=cfg.data.max_caption_len,
                folds=1, batch_size=cfg.eval.batch_size, device=device,
            )  # fmt: skip
            metrics.update({f"val/{k}": v for k, v in val_metrics.items()})
            state.history.append(dict(metrics))
            say(
                f"[raydist] epoch {state.epoch}/{cfg.train.epochs} done: loss {metrics['train/loss']:.4f} "
                f"val rsum {val_metrics['rsum']:.1f} (i2t R@1 {val_metrics['i2t_r1']:.1f}, "
                f"t2i R@1 {val_metrics['t2i_r1']:.1f})",
                flush=True,
            )
        _report(state, cfg, parts, data_dir, rank, metrics)
    if rank != 0:
        return None
    return {"history": state.history, "global_step": state.global_step, "resumed_at": state.resumed_at}


def _train_step(
    parts: Trainables,
    batch: dict[str, np.ndarray],
    vocab: Vocab,
    cfg: Config,
    hardest: bool,
    global_step: int,
    device: torch.device,
    stats: dict[str, float],
) -> float:
    """One optimisation step on this worker's rows; returns this rank's loss value."""
    model, optimizer, scaler = parts.model, parts.optimizer, parts.scaler
    tokens, lengths = vocab.encode_batch(list(batch["caption"]), cfg.data.max_caption_len)
    features = torch.as_tensor(np.stack(batch["image"]), dtype=torch.float32, device=device)
    with autocast(cfg.train.amp, device):
        img, cap = model(features, torch.as_tensor(tokens, device=device), torch.as_tensor(lengths))
    img, cap = img.float(), cap.float()  # the loss and its hinge arithmetic stay in fp32
    loss = step_ranking_loss(
        img,
        cap,
        image_ids=torch.tensor(batch["image_id"], device=device),
        sample_ids=torch.tensor(batch["sample_id"], device=device),
        loss_cfg=cfg.loss,
        batch_size=cfg.train.batch_size,
        hardest=hardest,
        generator=step_generator(cfg.train.seed, global_step),
        stats=stats,
    )
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if cfg.train.grad_clip > 0:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    return float(loss.detach())


def autocast(amp: str, device: torch.device) -> torch.autocast:
    """Autocast context for ``train.amp`` ("none" disables it)."""
    dtype = torch.float16 if amp == "fp16" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype, enabled=amp != "none")


def _restore(path: str | Path, cfg: Config, parts: Trainables) -> LoopState:
    state, saved_cfg, folder = load_checkpoint(path)
    check_compatible(saved_cfg, cfg, saved_from=str(folder))
    parts.load_state_dict(state)
    set_rng_state(state["rng"])
    loop = LoopState(**state["loop"])
    loop.resumed_at.append(loop.global_step)
    say(f"[raydist] resumed from {folder} at epoch {loop.epoch + 1}, step {loop.global_step}", flush=True)
    return loop


def _report(
    state: LoopState,
    cfg: Config,
    parts: Trainables,
    data_dir: Path,
    rank: int,
    metrics: dict[str, Any],
) -> None:
    """Every rank reports (a barrier); rank 0 attaches the checkpoint."""
    metrics = {**metrics, "epoch": state.epoch, "step": state.global_step}
    # Mid-epoch checkpoints have no validation of their own: -1 keeps them out of "best by val rsum".
    metrics.setdefault("val/rsum", -1.0)
    if rank != 0:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory(prefix="raydist-ckpt-") as tmp:
        save_checkpoint(
            tmp,
            {
                **parts.state_dict(),
                "rng": rng_state(),
                "loop": vars(state),
                "feature_dim": _unwrap(parts.model).image.fc.in_features,
            },
            cfg,
            data_dir / "vocab.json",
        )
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))
