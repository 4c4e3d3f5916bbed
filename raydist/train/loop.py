"""The training loop of one worker, read top to bottom: batch → encode → gather → negative-set draw →
loss → backward (+ after-backward hooks) → step → report. It imports no Ray: a :class:`Runtime` supplies
rank, world size, device, batches, reports and checkpoints (Ray Train in raydist.train.ray_worker, a plain
process in raydist.train.local). All ranks run the same number of equal-size steps and report the same
number of times (a report is a barrier under Ray)."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from raydist.checkpoint import (
    StateRegistry,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from raydist.config import Config, epoch_steps
from raydist.console import say
from raydist.distributed import StepPlan, gather_step, step_generator
from raydist.distributed.reduce import all_reduce_sum
from raydist.malloc import tune_malloc
from raydist.models import unwrap_model
from raydist.retrieval.trained import check_resume
from raydist.tasks import Encoded, StepContext, Task, to_tensors
from raydist.tasks.base import PROBE_LOSS
from raydist.train.gradient_caching import cached_step_backward, check_model
from raydist.train.hooks import Hook
from raydist.train.optim import BackboneFreeze, EpochStepLR, WarmupDecay, build_optimizer, build_schedule
from raydist.train.progress import RunClock, eta_text


class Runtime(Protocol):
    """What the loop needs from where it runs."""

    rank: int
    world: int
    device: torch.device

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Move to the device and wrap for data parallelism."""

    def train_batches(self, epoch: int) -> Iterable[dict[str, np.ndarray]]:
        """This rank's transformed batches of ``epoch`` (equal count and size on every rank)."""

    def steps_per_epoch(self) -> int:
        """Steps one epoch holds (for progress and ETA)."""

    def checkpoint_to_restore(self) -> tuple[str, str] | None:
        """The checkpoint the run must continue from (after a restart), or None: ``(folder, location)``, the local
        folder to read and where the checkpoint lives (a URI's downloaded copy: the URI), which the resume line
        names."""

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None) -> None:
        """Publish metrics (and, on rank 0, the checkpoint folder, whose files may be moved)."""


@dataclass
class LoopState:
    """Counters that a checkpoint carries so a resumed run continues where it stopped."""

    epoch: int = 0  # epoch in progress
    step_in_epoch: int = 0  # steps of `epoch` already done
    global_step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    resumed_at: list[int] = field(default_factory=list)  # global step of every restore
    finished: bool = False  # the run's last epoch (or its early stop) is done: nothing left to resume


def autocast(amp: str, device: torch.device) -> torch.autocast:
    """Autocast context for ``train.amp`` ("none" disables it)."""
    dtype = torch.float16 if amp == "fp16" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype, enabled=amp != "none")


def at_least_fp32(x: Tensor) -> Tensor:
    """``x`` in float32 when autocast made it half precision (fp16, bf16); float32 and float64 as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def step_rate(step_ends: Sequence[float]) -> float:
    """Steps per second from the clock readings at the ends of consecutive steps:
    ``(n − 1) / (t_last − t_first)``; 0 with fewer than two readings. The interval before the first end (the
    epoch's first batch, warm-up) is not counted."""
    if len(step_ends) < 2:
        return 0.0
    return (len(step_ends) - 1) / max(step_ends[-1] - step_ends[0], 1e-9)


def samples_per_s(step_ends: Sequence[float], rows_per_step: int) -> float:
    """Global samples/s, the one definition of the progress lines, the per-epoch ``train/samples_per_s`` and
    the benchmarks: rows every step embeds over all workers × :func:`step_rate` (wall time between step ends:
    data, forward, backward, optimizer and hooks; validation and checkpoints between epochs are not counted)."""
    return rows_per_step * step_rate(step_ends)


class Progress:
    """Steps done of the epoch and of the run, samples/s (:func:`samples_per_s`) over the last ``window``
    steps of the epoch, and the run's ETA (:mod:`raydist.train.progress`; "at most" with ``early_stopping``)."""

    def __init__(
        self,
        epochs: int,
        steps_per_epoch: int,
        rows_per_step: int,
        window: int = 50,
        *,
        early_stopping: bool = False,
    ) -> None:
        self.epochs, self.steps, self.rows, self.window = epochs, steps_per_epoch, rows_per_step, window
        self.times: list[float] = []  # clock at the end of each step of this epoch
        self.done = 0
        self.early_stopping, self.clock = early_stopping, RunClock()

    def start_epoch(self) -> None:
        """Hand the previous epoch's steps to the run's clock and start this epoch's (samples/s counts no
        validation or checkpoint time; the ETA counts both)."""
        self.clock.finish_epoch(self.times)
        self.times = []

    def step(self) -> None:
        """Record one finished step."""
        self.times.append(time.perf_counter())
        self.done += 1

    def epoch_samples_per_s(self) -> float:
        """Global samples/s over every step of this epoch."""
        return samples_per_s(self.times, self.rows)

    def line(self, epoch: int, step_in_epoch: int) -> str:
        """``epoch 2/5 step 40/117 (34%) samples/s 1234 run ETA 3m05s`` (to the end of the run's last epoch)."""
        left = max(self.epochs * self.steps - (epoch * self.steps + step_in_epoch), 0)
        eta = self.clock.eta(self.times, left, self.epochs - epoch)
        pct = 100 * step_in_epoch / max(self.steps, 1)
        return (
            f"epoch {epoch + 1}/{self.epochs} step {step_in_epoch}/{self.steps} ({pct:.0f}%) "
            f"samples/s {samples_per_s(self.times[-(self.window + 1) :], self.rows):.0f} "
            f"{eta_text(eta, early_stopping=self.early_stopping)}"
        )


@dataclass
class Trainables:
    """What a step updates: model, optimizer, LR schedule and loss scaler (all registered as state), and the
    frozen-backbone phase (:mod:`raydist.train.optim`)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: EpochStepLR | WarmupDecay
    scaler: torch.amp.GradScaler
    freeze: BackboneFreeze

    @classmethod
    def build(
        cls, cfg: Config, model: nn.Module, device: torch.device, steps_per_epoch: int | None = None
    ) -> Trainables:
        """``steps_per_epoch``: the run's steps per epoch (needed by ``train.lr_schedule=cosine`` only)."""
        optimizer = build_optimizer(model, cfg.train)
        scheduler = build_schedule(optimizer, cfg.train, steps_per_epoch)
        # fp16 needs loss scaling; with "none"/"bf16" the scaler is a pass-through.
        scaler = torch.amp.GradScaler(device.type, enabled=cfg.train.amp == "fp16")
        return cls(
            model, optimizer, scheduler, scaler, BackboneFreeze(model, cfg.train.freeze_backbone_epochs)
        )

    def register(self, registry: StateRegistry) -> None:
        registry.register("model", unwrap_model(self.model))
        for name in ("optimizer", "scheduler", "scaler"):
            registry.register(name, getattr(self, name))


def run_loop(
    cfg: Config,
    task: Task,
    runtime: Runtime,
    plan: StepPlan,
    *,
    hooks: Sequence[Hook] = (),
    resume_from: str | None = None,
) -> dict[str, Any] | None:
    """Train on this worker; rank 0 returns ``{"history", "global_step", "resumed_at", "first_step_unix",
    "stopped"}`` (``first_step_unix``: the wall-clock time, ``time.time()``, when this attempt's first
    optimizer step finished, None without steps; ``stopped``: a hook's :meth:`Hook.stop_requested` ended the
    run early, after a checkpoint of the last step done)."""
    if plan.world != runtime.world:
        raise ValueError(f"step plan for {plan.world} workers, runtime has {runtime.world}")
    rank, device = runtime.rank, runtime.device
    if cfg.train.tune_malloc:
        tune_malloc()
    torch.manual_seed(cfg.train.seed)
    steps = epoch_steps(cfg.train, runtime.steps_per_epoch())
    parts = Trainables.build(cfg, task.build_model(), device, steps)
    registry = StateRegistry()
    parts.register(registry)
    registry.register("task", task)
    for hook in hooks:
        hook.setup(parts.model, registry)
    state = LoopState()
    restore = runtime.checkpoint_to_restore() or ((resume_from, resume_from) if resume_from else None)
    if restore:
        state = _restore(*restore, cfg, task, registry, rank)
    model = parts.model = runtime.prepare_model(parts.model)

    progress = Progress(
        cfg.train.epochs, steps, plan.rows_per_step, early_stopping=bool(cfg.train.early_stop_patience)
    )
    first_step_unix: float | None = None
    stopped = False
    while state.epoch < cfg.train.epochs:
        epoch = state.epoch
        model.train()
        phase = task.phase(epoch)
        if rank == 0 and phase and (epoch == 0 or phase != task.phase(epoch - 1)):
            say(f"[raydist] epoch {epoch + 1}/{cfg.train.epochs}: loss phase {phase}")
        if rank == 0 and (line := parts.freeze.line(epoch, cfg.train.backbone_lr_mult)):
            say(f"[raydist] epoch {epoch + 1}/{cfg.train.epochs}: {line}")
        loss_sum, n_steps = 0.0, 0
        progress.start_epoch()
        stat_sums: dict[str, float] = {}
        batches = runtime.train_batches(epoch)
        for hook in hooks:  # a hook may replace the epoch's batches (gradient-clustering sampling)
            batches = hook.wrap_batches(epoch, batches)
        for i, batch in enumerate(batches):
            if i >= steps:  # train.epoch_steps cut the epoch short
                break
            if i < state.step_in_epoch:  # resumed mid-epoch: these steps were done before
                continue
            ctx = StepContext(epoch, state.global_step, rank, runtime.world)
            for hook in hooks:
                hook.before_step(ctx)
            stats: dict[str, float] = {}
            loss = train_step(parts, task, batch, cfg, plan, ctx, device, stats, hooks)
            if first_step_unix is None:
                first_step_unix = time.time()
            for hook in hooks:
                hook.after_step(ctx, loss, stats)
            state.step_in_epoch += 1
            state.global_step += 1
            loss_sum += loss
            n_steps += 1
            for k, v in stats.items():
                stat_sums[k] = stat_sums.get(k, 0.0) + v
            progress.step()
            if rank == 0 and state.global_step % cfg.train.log_every == 0:
                extra = "".join(f" {k.split('/')[-1]} {v:.3g}" for k, v in stats.items())
                say(f"[raydist] {progress.line(epoch, state.step_in_epoch)} loss {loss:.4f}{extra}")
            answers = [
                hook.stop_requested(ctx) for hook in hooks
            ]  # every hook asked: each may be a collective
            stopped = any(answers)
            if stopped or (
                cfg.train.checkpoint_every and state.global_step % cfg.train.checkpoint_every == 0
            ):
                _report(state, cfg, task, registry, runtime, {"train/loss": loss})
            if stopped:
                if rank == 0:
                    say(
                        f"[raydist] stopped on request at epoch {epoch + 1}/{cfg.train.epochs}, step "
                        f"{state.global_step}: checkpoint saved"
                    )
                break
        if stopped:
            break
        parts.scheduler.after_epoch()
        state.epoch += 1
        state.step_in_epoch = 0
        totals = all_reduce_sum(torch.tensor([loss_sum, float(n_steps)], dtype=torch.float64))
        metrics: dict[str, Any] = {
            "epoch": state.epoch,
            "phase": phase,
            "step": state.global_step,
            "train/loss": float(
                totals[0] / totals[1].clamp(min=1)
            ),  # mean over ranks and steps: the global loss
            "train/samples_per_s": progress.epoch_samples_per_s(),
            **{f"train/{k}": v / max(n_steps, 1) for k, v in stat_sums.items()},  # epoch means of step stats
            **task.epoch_metrics(epoch),
        }
        notes = task.end_epoch(epoch, metrics)
        ctx = StepContext(epoch, state.global_step, rank, runtime.world)
        for hook in hooks:
            hook.end_of_epoch(ctx, model, metrics)
        stop = _early_stop(cfg, task, state.history, metrics, rank)
        if rank == 0:
            state.history.append(dict(metrics))
            val = {k[4:]: v for k, v in metrics.items() if k.startswith("val/")}
            shown = f" {task.summary(val)}" if val else ""
            probe = (
                f" (probe loss {metrics['train/' + PROBE_LOSS]:.4f})"
                if f"train/{PROBE_LOSS}" in metrics
                else ""
            )
            say(
                f"[raydist] epoch {state.epoch}/{cfg.train.epochs} done: loss {metrics['train/loss']:.4f}{probe}{shown}"
            )
            for note in notes:
                say(f"[raydist] note: {note}")
            if stop:
                say(
                    f"[raydist] early stop: val {task.primary_metric} did not improve for "
                    f"{cfg.train.early_stop_patience} epochs"
                )
        state.finished = stop or state.epoch >= cfg.train.epochs
        _report(state, cfg, task, registry, runtime, metrics)
        if stop:
            break
    if rank != 0:
        return None
    return {
        "history": state.history,
        "global_step": state.global_step,
        "resumed_at": state.resumed_at,
        "first_step_unix": first_step_unix,
        "stopped": stopped,
    }


def _early_stop(
    cfg: Config, task: Task, history: list[dict[str, Any]], metrics: dict[str, Any], rank: int
) -> bool:
    """``train.early_stop_patience`` epochs without a better val metric (rank 0 decides; every rank gets the
    same answer through one all-reduce, so all ranks run the same number of steps)."""
    patience = cfg.train.early_stop_patience
    if not patience:
        return False
    key = f"val/{task.primary_metric}"
    scores = [m.get(key, float("-inf")) for m in [*history, metrics]]
    flag = torch.tensor([float(rank == 0 and epochs_without_improvement(scores) >= patience)])
    return bool(all_reduce_sum(flag).item() > 0)


def epochs_without_improvement(scores: Sequence[float]) -> int:
    """Epochs since the best score of ``scores`` (one per epoch, higher is better; the first of equal bests
    counts, so a tie is no improvement): ``len(scores) − 1 − argmax``; 0 for no scores."""
    if not scores:
        return 0
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    return len(scores) - 1 - best


def train_step(
    parts: Trainables,
    task: Task,
    batch: dict[str, np.ndarray],
    cfg: Config,
    plan: StepPlan,
    ctx: StepContext,
    device: torch.device,
    stats: dict[str, float],
    hooks: Sequence[Hook] = (),
) -> float:
    """One optimisation step on this worker's rows; returns this rank's training loss (without the part that
    trains a probe, which the task puts in ``stats[PROBE_LOSS]``)."""
    model, optimizer, scaler = parts.model, parts.optimizer, parts.scaler
    tensors = to_tensors(batch, device)
    ctx = dataclasses.replace(ctx, batch=tensors)

    def loss_of(encoded: Encoded) -> Tensor:
        # the loss and its hinge arithmetic stay in fp32 (or fp64: a float64 model's loss is not rounded)
        encoded.embeddings = {k: at_least_fp32(v) for k, v in encoded.embeddings.items()}
        if "weight" in tensors:  # gradient-clustering batches: row i's contribution counts w_i times
            encoded = encoded.weighted(tensors["weight"])
        gathered = gather_step(encoded.embeddings, encoded.ids, enabled=cfg.loss.gather and task.gathers)
        negative_set = plan.draw(ctx.rank, step_generator(cfg.train.seed, ctx.global_step))
        return task.loss(encoded, gathered, negative_set, ctx, stats)

    optimizer.zero_grad(set_to_none=True)
    # gradient caching: the encoders run twice, chunk rows at a time (raydist/train/gradient_caching.py)
    if chunk := cfg.train.grad_cache_chunk:
        check_model(model, hooks, chunk)
        loss = cached_step_backward(
            model,
            task,
            tensors,
            loss_of,
            chunk=chunk,
            device=device,
            autocast=lambda: autocast(cfg.train.amp, device),
            backward=lambda value: scaler.scale(value).backward(),
        )
    else:
        with autocast(cfg.train.amp, device), ExitStack() as around_forward:
            for hook in hooks:
                around_forward.enter_context(hook.forward_context(ctx))
            encoded = task.encode(model, tensors)
        loss = loss_of(encoded)
        scaler.scale(loss).backward()
    parts.freeze.discard_grads(ctx.epoch)
    for hook in hooks:
        hook.after_backward(ctx, model)
    if cfg.train.grad_clip > 0:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    parts.scheduler.after_step()
    return float(loss.detach()) - stats.get(PROBE_LOSS, 0.0)  # a probe's loss is reported apart (stats)


def _restore(
    path: str | Path, location: str, cfg: Config, task: Task, registry: StateRegistry, rank: int
) -> LoopState:
    state, saved_cfg, folder = load_checkpoint(path)
    check_resume(state, saved_cfg, folder, cfg, task.info)
    registry.load_state_dict(state)
    set_rng_state(state["rng"])
    loop = LoopState(**state["loop"])
    loop.resumed_at.append(loop.global_step)
    loop.finished = False  # until this attempt's last epoch is done
    if rank == 0:
        shown = folder if location == str(path) else location  # a run folder given: the checkpoint in it
        say(f"[raydist] resumed from {shown} at epoch {loop.epoch + 1}, step {loop.global_step}")
    return loop


def _report(
    state: LoopState,
    cfg: Config,
    task: Task,
    registry: StateRegistry,
    runtime: Runtime,
    metrics: dict[str, Any],
) -> None:
    """Every rank reports; rank 0 attaches the checkpoint. A mid-epoch checkpoint has no validation of its
    own: its score is −inf, so it never counts as best (the newest checkpoint is always kept for restarts)."""
    primary = f"val/{task.primary_metric}"
    # the primary metric first: Tune's live table shows the first metrics of a report
    metrics = {
        primary: metrics.get(primary, float("-inf")),
        **metrics,
        "epoch": state.epoch,
        "step": state.global_step,
    }
    if runtime.rank != 0:
        runtime.report(metrics, None)
        return
    with tempfile.TemporaryDirectory(prefix="raydist-ckpt-") as tmp:
        save_checkpoint(
            tmp,
            {**registry.state_dict(), "rng": rng_state(), "loop": vars(state)},
            cfg,
            task=task.info.to_json(),
            files=task.info.files,
        )
        runtime.report(metrics, tmp)
