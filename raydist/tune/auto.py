"""``raydist train --data DIR --auto [--budget MIN]``: a short Ray Tune search (ASHA on the task's val metric) over
the recipe's main knobs before the run, then the run with the winner's values.

The knobs (:func:`auto_knobs`), each kept as the user set it on the command line: ``train.lr`` (log-uniform,
×0.3–×3 of the config's), the crop of encoded images (small ones, where the recipe pads and crops:
``data.crop`` pad or none and ``data.crop_pad``; large ones, random resized crops: the lower bound of
``data.crop_scale``), ``data.flip``, small-cnn's ``model.cnn_width`` and ``model.cnn_grid``, and ``loss.hardest``
where the task reads it (pairs). Feature vectors: ``train.lr`` and ``loss.hardest`` only.

Every trial trains in process (``train.num_workers=0``, no worker group to wait for) on the train split the driver
read and decoded once (:class:`raydist.train.local.SharedSplit`, through Ray's object store); the first trial has
the defaults. A trial is the full run's schedule cut short (:func:`trial_base`): at most a third of its steps, and
as many epochs as the budget allows for a handful of trials, measured on two optimizer steps and one validation
here first (:func:`probe_seconds`, :func:`plan_trials`); Tune's time budget ends the search at the deadline."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raydist.config import Config, ConfigError, apply_overrides, dump_yaml
from raydist.console import say
from raydist.data.stream import fits_in_memory
from raydist.runtime import is_uri, run_name, storage_root
from raydist.tasks import DataInfo, Task, build_task, get_task
from raydist.tasks.images import PAD_CROP_MAX_SIDE, augmentation, crop_size, image_config_problems
from raydist.train.plan import prepare_run, step_plan
from raydist.tune.space import parse_space, trial_config
from raydist.tune.sweep import SweepOutcome, TrialRow, TrialSetup, run_sweep

DEFAULT_BUDGET_MIN = 5.0  # minutes of search
AUTO_CONFIG_FILE = "auto_config.yaml"  # the winner as a preset, in the run folder
AUTO_SPACE = "auto"  # the sweep's name: <run folder>/tune-auto-<time>/
LR_RANGE = (0.3, 3.0)  # train.lr searched log-uniformly in [lr × 0.3, lr × 3]
CNN_WIDTHS = (16, 32, 48)
CNN_GRIDS = (1, 2, 3)
CROP_SCALE_LOWS = (0.08, 0.2, 0.35, 0.5)  # lower bounds of data.crop_scale for random resized crops
TRIALS = 6  # trials that fit the budget at full trial length (the defaults first) ...
TRIAL_DRAWS = (
    3  # ... times this many are drawn: ASHA's early stops leave room for more; the deadline ends the rest
)
TRIAL_SHARE = 3  # a trial runs at most a third of the full run's epochs
MAX_CONCURRENT = 4  # trials at a time, one per core up to this
ASHA_REDUCTION = 3  # ASHA keeps the best third at each rung
MIN_GRACE_STEPS = (
    20  # optimizer steps every trial runs before ASHA may stop it (8 steps are noise, see asha_grace)
)
TRIAL_OVERHEAD_S = (
    5.0  # a trial's start: actor, imports (once per actor: actors are reused), model, val split decode
)
RAY_START_S = 10.0  # a local Ray instance with its dashboard, when none runs yet
PROBE_STEPS = 2  # timed optimizer steps, after one that warms up
ENDED = {
    "UNFINISHED": "cut at the deadline",
    "ERROR": "failed",
}  # a trial row's status, as the summary says it


@dataclass(frozen=True)
class Knob:
    """One searched config key: its distribution as a space file writes it, and the config's own value."""

    key: str
    spec: dict[str, list[Any]]
    default: Any


@dataclass
class AutoOutcome:
    """What ``--auto`` decided: the run's config (the user's with the winner's values; ``train.run_name`` set so
    the run folder holds the search and :data:`AUTO_CONFIG_FILE`) and how the search went."""

    config: Config
    knobs: list[Knob]
    sweep: SweepOutcome | None = None
    winner: TrialRow | None = None
    defaults: TrialRow | None = None
    preset_path: str | None = None
    lines: list[str] = field(default_factory=list)


def auto_knobs(cfg: Config, info: DataInfo, fixed: Collection[str] = ()) -> list[Knob]:
    """The knobs searched for ``cfg`` (its schedule and augmentation resolved, as
    :func:`raydist.train.plan.resolve_schedule` gives it) on the data ``info`` describes; keys in ``fixed``
    (the command line's) and keys the task does not read are left out. The crop knobs follow the crop the
    images get (:func:`raydist.tasks.images.augmentation`): up to :data:`PAD_CROP_MAX_SIDE` px pad-and-crop or
    none with the padding; above, the lower bound of the random resized crop's area."""
    task = get_task(info.task)
    kind = task.loss_kind(cfg)
    knobs: list[Knob] = []

    def add(key: str, spec: dict[str, list[Any]], default: Any) -> None:
        if key in fixed or not task.reads(key, kind):
            return
        values = next(iter(spec.values()))
        if "choice" in spec and len(values) < 2:
            return
        knobs.append(Knob(key, spec, default))

    lr = cfg.train.lr
    add("train.lr", {"loguniform": [lr * LR_RANGE[0], lr * LR_RANGE[1]]}, lr)
    if info.encoded:
        aug = augmentation(cfg, info)
        size = crop_size(cfg, info)
        crops = [aug.crop]
        if "data.crop" not in fixed and size <= PAD_CROP_MAX_SIDE:
            crops = _unique(["pad", "none", aug.crop])
            add("data.crop", {"choice": crops}, aug.crop)
        if "pad" in crops:
            pad = aug.pad or cfg.data.crop_pad or max(1, round(size / 8))
            add("data.crop_pad", {"randint": [max(1, pad // 2), 2 * pad + 1]}, pad)
        if "resized" in crops:
            low, high = cfg.data.crop_scale
            lows = sorted({*(v for v in CROP_SCALE_LOWS if v < high), low})
            add("data.crop_scale", {"choice": [[v, high] for v in lows]}, [low, high])
        add("data.flip", {"choice": [True, False]}, aug.flip)
        if cfg.model.image_encoder == "small-cnn":
            for key, options in (("model.cnn_width", CNN_WIDTHS), ("model.cnn_grid", CNN_GRIDS)):
                default = _value(cfg, key)
                values = [
                    v
                    for v in sorted({*options, default})
                    if v == default or not image_config_problems(apply_overrides(cfg, {key: v}), info)
                ]
                add(key, {"choice": values}, default)
    add("loss.hardest", {"choice": [True, False]}, cfg.loss.hardest)
    return knobs


def trial_base(full: Config, epochs: int, threads: int) -> Config:
    """A trial's config: the full run's (``full``, its schedule resolved) cut to ``epochs``, with its LR decay,
    backbone freeze, SH warm-up and LR warm-up at the same fraction of the shorter run (step floors off, so the
    trial's epochs stay); in process on ``threads`` torch threads, one checkpoint kept, no TensorBoard."""
    t = full.train
    share = epochs / t.epochs

    def scaled(n: int) -> int:
        return max(1, round(n * share)) if n else n

    return trial_config(
        full,
        {
            "train.epochs": epochs,
            "train.min_steps": 0,
            "train.lr_decay_epoch": scaled(t.lr_decay_epoch),
            "train.freeze_backbone_epochs": scaled(t.freeze_backbone_epochs),
            "train.warmup_steps": round(t.warmup_steps * share),
            "loss.warmup_sh_epochs": scaled(full.loss.warmup_sh_epochs),
            "loss.warmup_sh_steps": 0,
            "train.num_workers": 0,
            "train.min_workers": None,
            "train.cpus_per_worker": threads,
            "train.keep_checkpoints": 1,
            "train.checkpoint_every": 0,
            "train.tensorboard": False,
            "train.mlflow_uri": "",
            "train.run_name": "",
        },
    )


def asha_grace(epochs: int, steps_per_epoch: int) -> int:
    """The epochs every trial of ``epochs`` runs before ASHA may stop it: a ninth of the trial (rungs at 1/9 and
    1/3 of it) and :data:`MIN_GRACE_STEPS` steps, at most the whole trial (then ASHA stops none). On 1,100 32 px
    digits an epoch is 8 steps, and after one epoch 5 of 7 draws were still at chance (10 % top-1) and stopped,
    the defaults at 18-27 %: too early to tell a slow start from a bad config."""
    return min(
        epochs, max(1, round(epochs / ASHA_REDUCTION**2), math.ceil(MIN_GRACE_STEPS / steps_per_epoch))
    )


def trial_threads(cores: int | None = None) -> tuple[int, int]:
    """(trials at a time, torch threads each): one trial per core up to :data:`MAX_CONCURRENT`, the cores
    shared out (2 cores: 2 trials of 1 thread -- one thread a trial is also the fastest per step there)."""
    cores = max(1, cores or os.cpu_count() or 1)
    concurrent = min(cores, MAX_CONCURRENT)
    return concurrent, max(1, cores // concurrent)


def plan_trials(
    *,
    seconds: float,
    step_s: float,
    eval_s: float,
    steps_per_epoch: int,
    full_epochs: int,
    concurrent: int,
    trials: int = TRIALS,
) -> tuple[int, int]:
    """(epochs per trial, trials planned) so that ``trials`` trials of that length fit in ``seconds`` run
    ``concurrent`` at a time (each epoch: ``steps_per_epoch`` steps of ``step_s`` and one validation of
    ``eval_s``; each trial :data:`TRIAL_OVERHEAD_S` to start), at most a third of the full run's epochs. When
    not even one epoch each fits, fewer trials (at least 2: the defaults and one draw) of one epoch."""
    cap = max(1, math.ceil(full_epochs / TRIAL_SHARE))
    epoch_s = max(steps_per_epoch * step_s + eval_s, 1e-3)
    epochs = math.floor((seconds * concurrent / trials - TRIAL_OVERHEAD_S) / epoch_s)
    if epochs >= 1:
        return min(epochs, cap), trials
    return 1, max(2, min(trials, math.floor(seconds * concurrent / (TRIAL_OVERHEAD_S + epoch_s))))


def probe_seconds(cfg: Config, task: Task, arrays: Mapping[str, Any], threads: int) -> tuple[float, float]:
    """(seconds per optimizer step, seconds per validation) of ``cfg`` measured here on ``threads`` torch
    threads: :data:`PROBE_STEPS` steps (the epoch's views made included) after one that warms up, then one
    evaluation of the val split (its images decoded first, as a trial's first validation does)."""
    import torch

    from raydist.data.stream import InMemoryBatches
    from raydist.train.loop import StepContext, Trainables, train_step

    device = torch.device("cuda" if cfg.train.use_gpu and torch.cuda.is_available() else "cpu")
    plan = step_plan(cfg, task.info.task)
    batches = InMemoryBatches(
        dict(arrays),
        rows=plan.rows_per_worker,
        rank=0,
        world=1,
        seed=cfg.train.seed,
        epoch_transform=task.epoch_transform(),
    )
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        parts = Trainables.build(cfg, task.build_model().to(device), device, batches.steps_per_epoch())
        times, epoch = [], 0
        stream = iter(batches.epoch(epoch))
        for step in range(PROBE_STEPS + 1):
            start = time.perf_counter()
            batch = next(stream, None)
            if batch is None:  # an epoch of fewer steps than the probe
                epoch += 1
                stream = iter(batches.epoch(epoch))
                batch = next(stream)
            train_step(parts, task, batch, cfg, plan, StepContext(epoch, step, 0, 1), device, {})
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        task.evaluate(parts.model, "val", device)
        return statistics.median(times[1:]), time.perf_counter() - start
    finally:
        torch.set_num_threads(before)


def auto_search(
    cfg: Config,
    *,
    fixed: Collection[str] = (),
    budget_min: float = DEFAULT_BUDGET_MIN,
    address: str | None = None,
) -> AutoOutcome:
    """Search the knobs of ``cfg`` (:func:`auto_knobs`; keys in ``fixed`` stay as they are) for ``budget_min``
    minutes, print one line per knob (the value picked and the config's) and the winner's best val metric
    against the defaults' trial, write the winner as a preset (:data:`AUTO_CONFIG_FILE`) in the run's folder,
    and return the config the run trains with (``train.run_name`` set to that folder's name)."""
    from raydist.train.local import SharedSplit

    started = time.time()
    deadline = started + budget_min * 60
    if budget_min <= 0:
        raise ConfigError(f"--budget {budget_min:g}: give the search's minutes, e.g. --budget 5")
    storage = storage_root(cfg)
    if is_uri(storage):
        raise ConfigError(
            f"--auto keeps its search next to the run in a local folder, not {storage}: give a local "
            "--storage (shared by the nodes on a cluster)"
        )
    if cfg.train.run_name and (Path(storage) / cfg.train.run_name).exists():
        raise ConfigError(
            f"--auto starts a new run, and {Path(storage) / cfg.train.run_name} exists: choose a new "
            "--name, or leave --name out"
        )
    run_cfg = apply_overrides(cfg, {"train.run_name": run_name(cfg)})
    run_dir = Path(storage) / run_cfg.train.run_name
    plan = prepare_run(cfg)
    full, info, data_dir = plan.cfg, plan.info, plan.data_dir
    knobs = auto_knobs(full, info, fixed)
    if not knobs:
        line = "[raydist] auto: nothing to search (every knob is set on the command line or does not apply)"
        say(line)
        return AutoOutcome(run_cfg, knobs, lines=[line])
    concurrent, threads = trial_threads()
    defaults = {k.key: k.default for k in knobs}
    probe_cfg = trial_config(trial_base(full, 1, threads), defaults)
    task = build_task(probe_cfg, info)
    shared = SharedSplit.read(probe_cfg, task)
    steps_per_epoch = len(next(iter(shared.arrays.values()))) // step_plan(probe_cfg, info.task).rows_per_step
    step_s, eval_s = probe_seconds(probe_cfg, task, shared.arrays, threads)
    if (
        not fits_in_memory(data_dir, "train", cfg.data.in_memory_max_mb, manifest=info.manifest)
        or not shared.travels()
    ):
        shared = (
            None  # too big to hand every trial a copy, or no trial could tell it fits: each reads its own
        )
    import ray

    seconds = deadline - time.time() - (0.0 if ray.is_initialized() else RAY_START_S)
    epochs, planned = plan_trials(
        seconds=seconds,
        step_s=step_s,
        eval_s=eval_s,
        steps_per_epoch=steps_per_epoch,
        full_epochs=full.train.epochs,
        concurrent=concurrent,
        trials=TRIALS,
    )
    metric = f"val/{plan.task.primary_metric}"
    space = parse_space(
        {
            "metric": metric,
            "mode": "max",
            "search": "random",
            "num_samples": planned * TRIAL_DRAWS,
            "max_concurrent_trials": concurrent,
            "scheduler": {
                "type": "asha",
                "max_t": epochs,
                "grace_period": asha_grace(epochs, steps_per_epoch),
                "reduction_factor": ASHA_REDUCTION,
            },
            "space": {k.key: k.spec for k in knobs},
        },
        name=AUTO_SPACE,
    )
    full_steps = full.train.epochs * steps_per_epoch
    say(
        f"[raydist] auto: searching {', '.join(k.key for k in knobs)} for {budget_min:g} min on {metric}: "
        f"up to {space.num_samples} trials of up to {epochs} epochs ({epochs * steps_per_epoch} steps; the run: "
        f"{full_steps}), the defaults first, {concurrent} at a time in process, ASHA stops the worst early "
        f"(measured here: {step_s:.2f} s a step, {eval_s:.1f} s a validation)"
    )
    setup = TrialSetup(
        first=(defaults,),
        deadline=deadline,
        shared=shared,
        threads=threads,
        quiet=True,
        reuse_actors=True,
        seed=cfg.train.seed,
    )
    sweep = run_sweep(
        space, trial_base(full, epochs, threads), storage_path=str(run_dir), address=address, setup=setup
    )
    return _decide(run_cfg, knobs, sweep, defaults, run_dir, time.time() - started)


def _decide(
    run_cfg: Config,
    knobs: list[Knob],
    sweep: SweepOutcome,
    defaults: dict[str, Any],
    run_dir: Path,
    seconds: float,
) -> AutoOutcome:
    """The winner (Tune's best trial by the metric over every report), the lines, the preset."""
    rows = {r.trial: r for r in sweep.rows}
    winner = rows.get(sweep.best_trial) if sweep.best_trial else None
    first = next((r for r in sweep.rows if _same(r.values, defaults)), None)
    if winner is None:  # nothing to pick from: the run trains the defaults
        failed = [r for r in sweep.rows if r.status == "ERROR"]
        why = (
            f"{len(failed)} of {len(sweep.rows)} trials failed"
            if failed
            else f"the budget ended before any of {len(sweep.rows)} trials finished an epoch"
        )
        line = (
            f"[raydist] auto: no trial reported {sweep.metric} ({why}; see {sweep.experiment_path}): the run "
            "trains the defaults -- a larger --budget searches"
        )
        say(line)
        return AutoOutcome(run_cfg, knobs, sweep, None, first, None, [line])
    config = trial_config(run_cfg, winner.values)
    run_dir.mkdir(parents=True, exist_ok=True)
    preset = run_dir / AUTO_CONFIG_FILE
    preset.write_text(dump_yaml(apply_overrides(config, {"train.run_name": ""})))
    ended = [
        r.note.split(" at ")[0] if r.status == "TERMINATED" else ENDED.get(r.status, r.status.lower())
        for r in sweep.rows
    ]
    counts = ", ".join(f"{ended.count(e)} {e}" for e in dict.fromkeys(ended))
    lines = [
        f"[raydist] auto: {len(sweep.rows)} trials in {seconds / 60:.1f} min ({counts}); {winner.trial} won:"
    ]
    width = max(len(k.key) for k in knobs)
    for k in knobs:
        picked, default = _plain(winner.values.get(k.key)), _plain(k.default)
        same = _same({k.key: picked}, {k.key: default})
        lines.append(
            f"[raydist] auto:   {k.key:<{width}} {_fmt(picked)}"
            + (" (the default)" if same else f" (default {_fmt(default)})")
        )
    lines.append(_metric_line(sweep, winner, first))
    lines.append(f"[raydist] auto: winning config {preset} (raydist train --preset-file {preset} reruns it)")
    for line in lines:
        say(line)
    return AutoOutcome(config, knobs, sweep, winner, first, str(preset), lines)


def _metric_line(sweep: SweepOutcome, winner: TrialRow, first: TrialRow | None) -> str:
    """``val/top1 91.3 (10 epochs) vs the defaults' 88.0 (10 epochs)``, with the winner's value at the defaults'
    last epoch when ASHA stopped the defaults sooner."""
    metric = sweep.metric
    won = f"{metric} {_fmt(winner.metric)} ({winner.epochs} epochs)"
    if first is None:
        return f"[raydist] auto: {won}; the defaults' trial did not run (the time budget ended first)"
    if first.trial == winner.trial:
        others = [r for r in sweep.rows if r.trial != first.trial and r.metric is not None]
        runner = max(others, key=lambda r: r.metric, default=None)
        return f"[raydist] auto: the defaults won: {won}" + (
            f"; the next best {_fmt(runner.metric)} ({runner.trial}, {runner.epochs} epochs)"
            if runner
            else ""
        )
    if first.metric is None:
        return f"[raydist] auto: {won} vs the defaults' trial: {first.status.lower()} without a {metric}"
    line = f"[raydist] auto: {won} vs the defaults' {_fmt(first.metric)} ({first.epochs} epochs)"
    if first.epochs < winner.epochs:
        at = _metric_at(sweep.experiment_path, winner.trial, metric, first.epochs)
        line += f"; at epoch {first.epochs} the winner had {_fmt(at)}" if at is not None else ""
    return line


def _metric_at(experiment_path: str, trial: str, metric: str, epoch: int) -> float | None:
    """The best ``metric`` a trial reported up to ``epoch`` (its result.json)."""
    path = Path(experiment_path) / trial / "result.json"
    try:
        reports = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError:
        return None
    values = [
        r[metric]
        for r in reports
        if r.get("epoch", 0) <= epoch and isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric])
    ]
    return max(values) if values else None


def _value(cfg: Config, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The same swept values (floats within a relative 1e-9: Tune hands the values back through JSON)."""
    if set(a) != set(b):
        return False
    for key, x in a.items():
        y = b[key]
        if isinstance(x, float) or isinstance(y, float):
            if not (
                isinstance(x, (int, float))
                and isinstance(y, (int, float))
                and math.isclose(x, y, rel_tol=1e-9)
            ):
                return False
        elif _plain(x) != _plain(y):
            return False
    return True


def _unique(values: list[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
