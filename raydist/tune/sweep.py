"""Sweeps: each Tune trial is a full raydist training run (a TorchTrainer fitted inside a Tune
function trainable), ASHA acts on per-epoch metrics; results table, best-config preset, resume."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from raydist.config import Config, ConfigError, dump_yaml, failure_retries, from_saved
from raydist.console import is_verbose, quiet_ray_logger_console, route_ray_output, say, status
from raydist.runfiles import BEST_CONFIG_FILE, LOG_FILE, SWEEP_FILE
from raydist.runtime import (
    DATA_CPUS,
    Capacity,
    check_fits,
    check_storage_reachable,
    cluster_capacity,
    init_ray,
    run_cpus,
)
from raydist.tasks import DataInfo
from raydist.train.plan import check_run, open_dataset, plan_for, resolve_schedule
from raydist.train.trainer import build_trainer
from raydist.tune.space import SweepSpace, parse_space, trial_config, trial_configs

if TYPE_CHECKING:
    from raydist.train.local import SharedSplit

TRAIN_RUN_NAME = "train"  # each trial's Train run: <experiment>/<trial folder>/train
TRIAL_CONSOLE_FILE = "console.log"  # a quiet trial's own console lines, in its Train run folder


@dataclass(frozen=True)
class TrialSetup:
    """How a sweep of in-process trials (``train.num_workers=0``) runs, as ``raydist train --auto`` starts it
    (:mod:`raydist.tune.auto`); the defaults are those of ``raydist tune``."""

    first: tuple[dict[str, Any], ...] = ()  # the swept values of the first trials (Tune's points_to_evaluate)
    deadline: float | None = None  # time.time() when Tune stops the sweep (its time_budget_s, counted at fit)
    shared: SharedSplit | None = None  # the train split the driver read and decoded, for every trial it fits
    threads: int | None = None  # torch threads of each in-process trial (None: torch's default)
    quiet: bool = (
        False  # a trial's own lines (epochs, notes) go to <trial>/train/console.log, not the console
    )
    reuse_actors: bool = (
        False  # Tune runs the next trial in a finished trial's actor (imports done, split held)
    )
    seed: int | None = None  # the random search's draws


@dataclass
class TrialRow:
    """One line of the results table."""

    trial: str
    values: dict[str, Any]
    metric: float | None  # best value over the trial's reports (per `mode`)
    epochs: int
    status: str  # Ray Tune's trial status: TERMINATED | ERROR; UNFINISHED = interrupted (resume it)
    error: str = ""
    note: str = ""  # why a TERMINATED trial ended: "all epochs" or "stopped early (scheduler)"


@dataclass
class SweepOutcome:
    """What a sweep leaves behind."""

    experiment_path: str
    metric: str
    keys: list[str]
    rows: list[TrialRow]
    best_trial: str | None
    best_config_path: str | None
    best_checkpoint: str | None


def sweep_cpus(space: SweepSpace, cfg: Config) -> float:
    """Logical CPUs the sweep occupies: max_concurrent_trials × (trial driver + train workers × CPUs per
    worker + Ray Data)."""
    return space.max_concurrent_trials * (space.trial_cpus + run_cpus(cfg))


def check_sweep_fits(space: SweepSpace, cfg: Config, capacity: Capacity) -> None:
    """Refuse a sweep that the cluster can never schedule (Tune would wait forever, silently)."""
    need = sweep_cpus(space, cfg)
    check_fits(
        need,
        capacity,
        what=f"sweep {space.name!r} needs {need:g} logical CPUs = max_concurrent_trials "
        f"{space.max_concurrent_trials} × (trial_cpus {space.trial_cpus:g} + {_run_cpus_terms(cfg)}),",
        fix="lower max_concurrent_trials or resources: in the space file, pass train.num_workers=/"
        "train.cpus_per_worker= overrides, or add nodes",
    )


def _run_cpus_terms(cfg: Config) -> str:
    """:func:`raydist.runtime.run_cpus` of ``cfg`` spelled out for an error message."""
    t = cfg.train
    if t.num_workers == 0:
        return f"train.cpus_per_worker {t.cpus_per_worker:g} of the in-process run (train.num_workers=0)"
    return (
        f"train.num_workers {t.num_workers} × train.cpus_per_worker {t.cpus_per_worker:g} + {DATA_CPUS:g} "
        "for Ray Data"
    )


def tune_param_space(space: SweepSpace) -> dict[str, Any]:
    """The Tune search space: one Tune domain per swept dotted key."""
    from ray import tune

    make = {
        "choice": lambda a: tune.choice(list(a)),
        "grid": lambda a: tune.grid_search(list(a)),
        "uniform": lambda a: tune.uniform(*a),
        "loguniform": lambda a: tune.loguniform(*a),
        "randint": lambda a: tune.randint(*a),
    }
    return {p.key: make[p.kind](p.args) for p in space.params}


def trial_driver(
    config: dict[str, Any],
    *,
    base: dict[str, Any],
    info: DataInfo,
    experiment_path: str,
    setup: TrialSetup | None = None,
) -> None:
    """Tune function trainable: one training run with this trial's values. Train workers report per
    epoch; ``TuneReportCallback`` forwards rank 0's metrics to Tune, so ASHA can stop the trial. With
    ``train.num_workers=0`` the trial trains in its own process (no worker group to start: seconds less per
    trial) and forwards each report itself, the checkpoint's folder as ``checkpoint_path`` as Train's does;
    ``setup`` (:class:`TrialSetup`) may give it the driver's decoded train split, its torch threads, and a quiet
    console."""
    from ray import tune
    from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY, TuneReportCallback

    from raydist.train.trainer import train_in_process

    setup = setup or TrialSetup()
    plan = plan_for(
        trial_config(from_saved(base), config), info
    )  # the data was checked by the sweep's driver
    cfg = plan.cfg
    trial_folder = f"{experiment_path}/{Path(tune.get_context().get_trial_dir()).name}"
    if cfg.train.num_workers == 0:

        def forward(metrics: dict[str, Any], checkpoint: Path | None) -> None:
            tune.report({**metrics, **({CHECKPOINT_PATH_KEY: str(checkpoint)} if checkpoint else {})})

        run_dir = Path(trial_folder) / TRAIN_RUN_NAME
        if setup.threads:
            import torch

            torch.set_num_threads(setup.threads)
        with _trial_console(run_dir if setup.quiet else None):
            train_in_process(plan, run_dir=run_dir, on_report=forward, shared=setup.shared)
        return
    trainer = build_trainer(
        plan,
        callbacks=[TuneReportCallback()],
        run_name_override=TRAIN_RUN_NAME,
        storage_path=trial_folder,
    )
    trainer.fit()


@contextlib.contextmanager
def _trial_console(run_dir: Path | None) -> Iterator[None]:
    """With a run folder: this trial's console lines (stdout) go to its :data:`TRIAL_CONSOLE_FILE`."""
    if run_dir is None:
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / TRIAL_CONSOLE_FILE, "a") as f, contextlib.redirect_stdout(f):
        yield


def tune_verbosity() -> int:
    """Tune's console output: its live trial table only with ``-v`` (1), else none (0); :class:`TrialLines`
    prints one line per trial event either way."""
    return 1 if is_verbose() else 0


@contextlib.contextmanager
def quiet_tune_console() -> Iterator[None]:
    """Without ``-v``: Tune's older console output for the ``fit`` inside, which at verbosity 0 prints nothing
    (the default one prints its experiment table at any verbosity)."""
    if is_verbose() or "RAY_AIR_NEW_OUTPUT" in os.environ:
        yield
        return
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    # a failed trial's traceback goes to its error.txt, not the console
    os.environ["TUNE_PRINT_ALL_TRIAL_ERRORS"] = "0"
    quiet_ray_logger_console()  # Tune's slow-callback and trial warnings go to the sweep's raydist.log
    try:
        yield
    finally:
        os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        os.environ.pop("TUNE_PRINT_ALL_TRIAL_ERRORS", None)


# the live status line: redrawn each second on a terminal (True), else a line a minute
STATUS_EVERY_S = {True: 1.0, False: 60.0}


class TrialLines:
    """Our console lines of a sweep, one per trial event: started (its swept values), finished (epochs, last and
    best ``metric``), failed (the error's last line), and a live status line of the running trials (:meth:`tick`).
    The trials' own progress goes to the sweep's raydist.log, not the console. :func:`trial_lines_callback` calls
    it from Tune."""

    def __init__(self, space: SweepSpace) -> None:
        self.keys, self.metric, self.mode = space.keys, space.metric, space.mode
        self.best: dict[str, float] = {}
        self.started_at = time.monotonic()
        self.shown_at = self.started_at

    def summary(self, trials: list) -> str:
        """``[raydist] sweep 1m05s: 2 running, 1 done, 0 failed, 3 pending; best val/rsum 130.2 (trial_ab12)``."""
        counts = {"RUNNING": 0, "TERMINATED": 0, "ERROR": 0, "PENDING": 0}
        for trial in trials:
            counts[trial.status] = counts.get(trial.status, 0) + 1
        elapsed = int(time.monotonic() - self.started_at)
        line = (
            f"[raydist] sweep {elapsed // 60}m{elapsed % 60:02d}s: {counts['RUNNING']} running, "
            f"{counts['TERMINATED']} done, {counts['ERROR']} failed, {counts['PENDING']} pending"
        )
        scored = [(v, t) for t in trials if (v := self.best.get(t.trial_id)) is not None]
        if scored:
            value, trial = (max if self.mode == "max" else min)(scored, key=lambda p: p[0])
            line += f"; best {self.metric} {_fmt(value)} ({trial_dirname(trial)})"
        return line

    def tick(self, trials: list, tty: bool) -> None:
        """The status line, at most every :data:`STATUS_EVERY_S` seconds while trials run."""
        now = time.monotonic()
        if now - self.shown_at >= STATUS_EVERY_S[tty] and any(t.status == "RUNNING" for t in trials):
            self.shown_at = now
            status(self.summary(trials))

    def _values(self, trial: Any) -> str:
        config = trial.config or {}
        return " ".join(f"{k}={_fmt(config[k])}" for k in self.keys if k in config)

    def started(self, trial: Any) -> None:
        """``[raydist] trial trial_ab12 started: loss.margin=0.2``."""
        say(f"[raydist] trial {trial_dirname(trial)} started: {self._values(trial)}")

    def result(self, trial: Any, result: dict[str, Any]) -> None:
        """Keep the trial's best finite ``metric`` (per ``mode``)."""
        value = result.get(self.metric)
        if isinstance(value, (int, float)) and math.isfinite(value):
            old = self.best.get(trial.trial_id)
            better = old is None or (value > old if self.mode == "max" else value < old)
            self.best[trial.trial_id] = float(value) if better else old

    def finished(self, trial: Any) -> None:
        """``[raydist] trial trial_ab12 finished: loss.margin=0.2, 2 epochs, val/rsum 123.4 (best 130.2)``."""
        last = trial.last_result or {}
        value, best = last.get(self.metric), self.best.get(trial.trial_id)
        shown = f"{self.metric} {'-' if value is None else _fmt(value)}" + (
            "" if best is None else f" (best {_fmt(best)})"
        )
        say(
            f"[raydist] trial {trial_dirname(trial)} finished: {self._values(trial)}, {last.get('epoch', 0)} epochs, "
            f"{shown}"
        )

    def failed(self, trial: Any) -> None:
        """``[raydist] trial trial_ab12 failed: loss.margin=0.2: <the error's last line>``."""
        say(
            f"[raydist] trial {trial_dirname(trial)} failed: {self._values(trial)}: "
            f"{_error_line(_trial_error(trial)) or 'error'} (traceback: {getattr(trial, 'error_file', None) or trial.path})"
        )


def trial_lines_callback(space: SweepSpace) -> Any:
    """A ``ray.tune.Callback`` that prints :class:`TrialLines` as trials start, finish and fail."""
    from ray.tune import Callback

    lines = TrialLines(space)

    class PrintTrialLines(Callback):
        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            lines.started(trial)

        def on_trial_result(
            self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
        ) -> None:
            lines.result(trial, result)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            lines.finished(trial)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            lines.failed(trial)

        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            lines.tick(trials, sys.stdout.isatty())

    return PrintTrialLines()


def trial_dirname(trial: Any) -> str:
    """Short, stable trial folder names (Tune's default embeds every value and a timestamp)."""
    return f"trial_{trial.trial_id}"


def run_sweep(
    space: SweepSpace,
    cfg: Config,
    *,
    storage_path: str | None = None,
    address: str | None = None,
    setup: TrialSetup | None = None,
) -> SweepOutcome:
    """Check data and resources, run every trial, summarise, write the best config. ``setup``: how in-process
    trials run (:class:`TrialSetup`; ``raydist train --auto``)."""
    from ray import tune

    setup = setup or TrialSetup()
    search_alg = _search_alg(space, setup)
    info = open_dataset(cfg)
    check_run(cfg, info, trial_configs(space, cfg))  # every trial config against the data, before Ray starts
    storage = _absolute(storage_path or cfg.train.storage_path or "runs")
    name = f"tune-{space.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    experiment_path = f"{storage}/{name}"
    if "://" in storage and any(c.train.num_workers == 0 for c in trial_configs(space, cfg)):
        raise ConfigError(
            f"trials with train.num_workers=0 train in their Tune actor and keep their checkpoints "
            f"in a local folder, not under {storage}: give a local --storage (shared by the "
            "nodes on a cluster) or train.num_workers ≥ 1"
        )
    _start_ray(space, cfg, address, experiment_path)
    _write_text(
        experiment_path,
        SWEEP_FILE,
        yaml.safe_dump(
            {
                "name": space.name,
                "space": space.source,
                "config": cfg.to_dict(),
                "data_dir": str(info.data_dir),
            },
            sort_keys=False,
        ),
    )
    tuner = tune.Tuner(
        _trainable(space, cfg, info, experiment_path, setup),
        param_space=tune_param_space(space),
        tune_config=tune.TuneConfig(
            metric=space.metric,
            mode=space.mode,
            num_samples=space.num_samples,
            # a BasicVariantGenerator of ours limits itself (Tune's limit applies to Searchers only)
            max_concurrent_trials=None if _generates(search_alg) else space.max_concurrent_trials,
            scheduler=_scheduler(space, cfg, info),
            search_alg=search_alg,
            trial_dirname_creator=trial_dirname,
            reuse_actors=setup.reuse_actors,
            time_budget_s=None if setup.deadline is None else max(1.0, setup.deadline - time.time()),
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage,
            failure_config=tune.FailureConfig(max_failures=failure_retries(cfg.train)),
            callbacks=[trial_lines_callback(space)],
            verbose=tune_verbosity(),
        ),
    )
    with quiet_tune_console():
        grid = tuner.fit()
    return summarise(grid, space, cfg, experiment_path, info)


def resume_sweep(path: str, *, resume_errored: bool = False, address: str | None = None) -> SweepOutcome:
    """Continue an interrupted sweep from its experiment folder (unfinished trials continue; their
    Train runs resume from their last checkpoint). ``resume_errored`` also re-runs failed trials."""
    from ray import tune

    experiment_path = _absolute(path)
    try:
        saved = yaml.safe_load(_read_text(experiment_path, SWEEP_FILE))
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path} is not a raydist sweep folder (cannot read {SWEEP_FILE}: {e})") from e
    if not tune.Tuner.can_restore(experiment_path):
        raise ConfigError(f"{path} has no Tune experiment state to resume from")
    space, cfg = parse_space(saved["space"], name=saved["name"]), from_saved(saved["config"])
    info = DataInfo.from_dataset(saved["data_dir"])  # checked when the sweep started
    _start_ray(space, cfg, address, experiment_path)
    tuner = tune.Tuner.restore(
        experiment_path,
        trainable=_trainable(space, cfg, info, experiment_path),
        resume_errored=resume_errored,
    )
    run_config = (
        tuner._local_tuner.get_run_config()
    )  # restored from the first run: this console's settings instead
    run_config.callbacks, run_config.verbose = [trial_lines_callback(space)], tune_verbosity()
    with quiet_tune_console():
        grid = tuner.fit()
    return summarise(grid, space, cfg, experiment_path, info)


def summarise(
    grid: Any, space: SweepSpace, base: Config, experiment_path: str, info: DataInfo | None = None
) -> SweepOutcome:
    """Results table rows from a Tune ``ResultGrid``; writes the best trial's config as a preset. With the
    dataset's ``info``, a trial's planned epochs are those of its resolved schedule (``train.min_steps``)."""
    rows, checkpoints = [], {}
    for result in grid:
        row, checkpoints[Path(result.path).name] = _trial_row(result, space, base, info)
        rows.append(row)
    rows.sort(key=lambda r: r.trial)
    best = _best_row(grid, space, rows)
    return SweepOutcome(
        experiment_path=experiment_path,
        metric=space.metric,
        keys=space.keys,
        rows=rows,
        best_trial=best.trial if best else None,
        best_config_path=_write_best_config(experiment_path, trial_config(base, best.values))
        if best
        else None,
        best_checkpoint=checkpoints[best.trial] if best else None,
    )


def _best_row(grid: Any, space: SweepSpace, rows: list[TrialRow]) -> TrialRow | None:
    """The best trial by Ray's own pick: ``ResultGrid.get_best_result`` over every report of every trial
    (finite values only). A trial that failed after reporting can be the best by what it reported."""
    try:
        best = grid.get_best_result(
            metric=space.metric, mode=space.mode, scope="all", filter_nan_and_inf=True
        )
    except RuntimeError:  # no trial reported a finite value of the metric
        return None
    name = Path(best.path).name
    return next((r for r in rows if r.trial == name and r.metric is not None), None)


def trial_epochs(base: Config, values: dict[str, Any], info: DataInfo | None) -> int:
    """The epochs a trial with these swept ``values`` runs: its config's, raised by ``train.min_steps``
    for the dataset ``info`` describes (as ``trial_driver`` resolves it)."""
    cfg = trial_config(base, values)
    return resolve_schedule(cfg, info)[0].train.epochs if info else cfg.train.epochs


def _trial_row(
    result: Any, space: SweepSpace, base: Config, info: DataInfo | None = None
) -> tuple[TrialRow, str | None]:
    """A trial's table row and the checkpoint of its best report (per ``metric``/``mode``)."""
    import pandas as pd

    values = _trial_values(result, space)
    df = result.metrics_dataframe if result.metrics_dataframe is not None else pd.DataFrame()
    reports = df.dropna(subset=[space.metric]) if space.metric in df else df.iloc[0:0]
    reports = reports[reports[space.metric].abs() != float("inf")] if len(reports) else reports
    best = None
    if len(reports):
        metric = reports[space.metric]
        best = reports.loc[metric.idxmax() if space.mode == "max" else metric.idxmin()]
    epochs = int(df["epoch"].max()) if "epoch" in df and len(df) else 0
    planned = trial_epochs(base, values, info)
    row = TrialRow(
        trial=Path(result.path).name,
        values=values,
        metric=None if best is None else float(best[space.metric]),
        epochs=epochs,
        status=_status(result, epochs, planned),
        error=_error_line(result.error),
        note=_note(result, epochs, planned),
    )
    return row, None if best is None else best.get("checkpoint_path")


def format_results(outcome: SweepOutcome) -> str:
    """The results table: trial, swept values, best metric, epochs run, status (+ error line)."""
    header = ["trial", *outcome.keys, outcome.metric, "epochs", "status", "ended"]
    lines = [
        [
            r.trial,
            *(_fmt(r.values.get(k)) for k in outcome.keys),
            "-" if r.metric is None else _fmt(r.metric),
            str(r.epochs),
            r.status,
            (r.note or "-") + ("  <- best" if r.trial == outcome.best_trial else ""),
        ]
        for r in outcome.rows
    ]
    widths = [
        max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)
    ]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)).rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=False)).rstrip() for line in lines]
    out += [f"{r.trial} failed: {r.error}" for r in outcome.rows if r.status == "ERROR"]
    return "\n".join(out)


def _start_ray(space: SweepSpace, cfg: Config, address: str | None, experiment_path: str) -> None:
    """Start or join Ray, check the sweep fits, and send worker output to the experiment's raydist.log."""
    init_ray(sweep_cpus(space, cfg), address, plugins=cfg.plugins)
    capacity = cluster_capacity()
    check_sweep_fits(space, cfg, capacity)
    check_storage_reachable(experiment_path, cfg.train.storage_shared, capacity)
    if "://" not in experiment_path:
        route_ray_output(Path(experiment_path) / LOG_FILE, show_ours=False)


def _trainable(
    space: SweepSpace, cfg: Config, info: DataInfo, experiment_path: str, setup: TrialSetup | None = None
) -> Any:
    from ray import tune

    options = {} if setup is None else {"setup": setup}  # with_parameters puts it in Ray's object store once
    driver = tune.with_parameters(
        trial_driver, base=cfg.to_dict(), info=info, experiment_path=experiment_path, **options
    )
    return tune.with_resources(driver, partial(trial_resources, space.trial_cpus, cfg.to_dict()))


def trial_resources(trial_cpus: float, base: dict[str, Any], config: dict[str, Any]) -> dict[str, float]:
    """A trial actor's resources: ``trial_cpus`` for its driver; an in-process trial (``train.num_workers=0``)
    also holds what its one training process takes (``train.cpus_per_worker``, a GPU with ``train.use_gpu``)."""
    train = trial_config(from_saved(base), config).train
    if train.num_workers:
        return {"cpu": trial_cpus}
    return {"cpu": trial_cpus + train.cpus_per_worker, **({"gpu": 1} if train.use_gpu else {})}


def _scheduler(space: SweepSpace, cfg: Config, info: DataInfo) -> Any:
    """FIFO, or ASHA on epochs; ASHA's ``max_t`` defaults to the most epochs a checked trial config runs
    after ``train.min_steps`` raised them (a bigger swept batch has fewer steps per epoch)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    s = space.scheduler
    if s.kind == "fifo":
        return FIFOScheduler()
    planned = [resolve_schedule(c, info)[0].train.epochs for c in [cfg, *trial_configs(space, cfg)]]
    return ASHAScheduler(
        time_attr="epoch",
        max_t=s.max_t or max(planned),
        grace_period=s.grace_period,
        reduction_factor=s.reduction_factor,
    )


def _search_alg(space: SweepSpace, setup: TrialSetup | None = None) -> Any:
    """None (Tune's BasicVariantGenerator: random draws, grid entries crossed) or OptunaSearch; with
    ``setup.first`` or ``setup.seed``, a BasicVariantGenerator (or OptunaSearch) that runs those values first."""
    first = list(setup.first) if setup else []
    if space.search != "optuna":
        if not first and (setup is None or setup.seed is None):
            return None
        from ray.tune.search import BasicVariantGenerator

        return BasicVariantGenerator(
            points_to_evaluate=first or None,
            random_state=setup.seed,
            max_concurrent=space.max_concurrent_trials,
        )
    if importlib.util.find_spec("optuna") is None:
        raise ConfigError(
            f"space {space.name!r} uses search: optuna but optuna is not installed: "
            "pip install 'raydist[tune]' (or pip install optuna), or use search: random"
        )
    from ray.tune.search.optuna import OptunaSearch

    return OptunaSearch(points_to_evaluate=first or None)


def _generates(search_alg: Any) -> bool:
    """Whether ``search_alg`` is a BasicVariantGenerator (:func:`_search_alg` with first trials or a seed)."""
    from ray.tune.search import BasicVariantGenerator

    return isinstance(search_alg, BasicVariantGenerator)


def _trial_values(result: Any, space: SweepSpace) -> dict[str, Any]:
    """The swept values of a trial (from its params.json when it failed before reporting; none when its actor
    never ran, e.g. its node went away before it started, and Tune wrote no params.json)."""
    config = result.config
    if not config:
        try:
            config = json.loads(_read_text(result.path, "params.json"))
        except OSError:
            config = {}
    return {k: config[k] for k in space.keys if k in config}


def _status(result: Any, epochs: int, max_epochs: int) -> str:
    """The status Ray Tune's own table shows: ERROR, or TERMINATED (all epochs, or stopped early by the
    scheduler); UNFINISHED when the sweep was interrupted before the trial ended."""
    if result.error is not None:
        return "ERROR"
    return "TERMINATED" if epochs >= max_epochs or (result.metrics or {}).get("done") else "UNFINISHED"


def _note(result: Any, epochs: int, max_epochs: int) -> str:
    """Why a TERMINATED trial ended."""
    if _status(result, epochs, max_epochs) != "TERMINATED":
        return ""
    return "all epochs" if epochs >= max_epochs else f"stopped early at epoch {epochs} (scheduler)"


def _trial_error(trial: Any) -> Any:
    """The trial's error text: Tune's copy in the experiment storage, else the trial's local error file (the
    copy is synced after the error callbacks run)."""
    error = trial.get_error()
    if error is None and getattr(trial, "error_file", None) and Path(trial.error_file).is_file():
        error = Path(trial.error_file).read_text()
    return error


def _error_line(error: BaseException | str | None) -> str:
    """The last line of an error (the exception itself, not the traceback), kept short."""
    if error is None:
        return ""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    line = lines[-1] if lines else type(error).__name__
    return line if len(line) <= 200 else line[:197] + "..."


def _write_best_config(experiment_path: str, cfg: Config) -> str:
    """The best config as a preset file: in the experiment folder, or the current folder when the
    experiment lives on remote storage (``raydist train --preset-file`` reads local files)."""
    if "://" in experiment_path:
        path = Path.cwd() / f"{Path(experiment_path).name}-{BEST_CONFIG_FILE}"
    else:
        path = Path(experiment_path) / BEST_CONFIG_FILE
    path.write_text(dump_yaml(cfg))
    return str(path)


def _absolute(path: str) -> str:
    return path.rstrip("/") if "://" in path else str(Path(path).expanduser().resolve())


def _write_text(folder: str, name: str, text: str) -> None:
    """Write a small file into a local or remote (s3://, gs://) folder."""
    import pyarrow.fs

    fs, root = pyarrow.fs.FileSystem.from_uri(folder)
    fs.create_dir(root, recursive=True)
    with fs.open_output_stream(f"{root}/{name}") as f:
        f.write(text.encode())


def _read_text(folder: str, name: str) -> str:
    import pyarrow.fs

    fs, root = pyarrow.fs.FileSystem.from_uri(folder)
    try:
        with fs.open_input_stream(f"{root}/{name}") as f:
            return f.read().decode()
    except FileNotFoundError as e:
        raise OSError(f"{folder}/{name} not found") from e


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)
