"""Driver side of a training run: its plan (raydist.train.plan: data checked, schedule resolved, task built, once),
start or join Ray, build the TorchTrainer (or run in process), fit, and summarise (per-epoch table, best checkpoint by the task's validation metric, test metrics)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydist.checkpoint import change_lines, format_changes, load_checkpoint, local_folder, newest_checkpoint
from raydist.checkpoint.remote import remote_checkpoints
from raydist.config import Config, ConfigError, failure_retries
from raydist.console import route_ray_output, say
from raydist.data.remote import data_location
from raydist.data.stream import fits_in_memory, train_streams
from raydist.malloc import worker_env
from raydist.runfiles import HISTORY_FILE, LOG_FILE, STOP_FILE
from raydist.runtime import (
    check_cluster_fits,
    check_storage_reachable,
    cluster_capacity,
    init_ray,
    is_uri,
    run_cpus,
    run_name,
    start_train_coordinator,
    storage_root,
)
from raydist.train.plan import RunPlan, prepare_run
from raydist.train.stopping import stop_on_signals
from raydist.uris import cache_path, check_bucket, delete, join, location_of, storage_env, write_bytes

if TYPE_CHECKING:
    from raydist.train.local import ReportListener, SharedSplit

# Ray Train's worker-group start timeout (its env var; default 60 s) and the restarts of a start that timed out
# (FailureConfig.controller_failure_limit; default -1 = forever, which looks like a hang)
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
# How often Ray Train's controller polls its workers (its env var, passed on to the controller; default 2 s). A
# run ends only at the poll after its workers return, and each phase of a run waits for a poll, so 2 s polls
# cost a few seconds per run (tiny run on 2 cores: 4.8–5.3 s from the last step to fit() returning at 2 s,
# 1.5–1.9 s at 0.5 s). A poll is one small remote call per worker; a late reply is awaited, not an error (a
# worker counts as hung only after RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S, 10 min). A value set by the user wins.
POLL_INTERVAL_ENV, POLL_INTERVAL_S = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", 0.5
CONTROLLER_RETRIES = 1


@dataclass
class TrainOutcome:
    """What a finished run leaves behind."""

    run_dir: str
    best_checkpoint: str | None
    best_metrics: dict[str, Any] | None
    latest_checkpoint: str | None
    history: list[dict[str, Any]]
    resumed_at: list[int]
    test_metrics: dict[str, float] | None = None
    columns: list[tuple[str, str]] = field(default_factory=list)  # the task's (val metric, header) columns
    data_dir: str | None = None  # the dataset the run trained on
    first_step_unix: float | None = None  # time.time() when the first optimizer step finished (rank 0)
    best_by: str | None = None  # the val metric that picks the best checkpoint, e.g. "val/rsum"
    stopped: bool = False  # SIGINT/SIGTERM ended the run early; latest_checkpoint holds its last step
    # start-up marks of a Ray run (STARTUP_PHASES), time.time() of each: data_checked (every refusal made, Ray not
    # started), ray_ready, and rank 0's workers_started (its train function began) and data_ready (split read)
    startup: dict[str, float] = field(default_factory=dict)


def build_trainer(
    plan: RunPlan,
    *,
    resume_from: str | None = None,
    callbacks: list[Any] | None = None,
    run_name_override: str | None = None,
    storage_path: str | None = None,
) -> Any:
    """A ``TorchTrainer`` for the run ``plan`` describes (gloo on CPU, nccl on GPU via ``train.use_gpu``). A train
    split that fits ``data.in_memory_max_mb`` is read once by every worker; a larger one streams through Ray
    Data."""
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raydist.train.elastic import FreshCapacityOnRestart
    from raydist.train.ray_worker import train_loop_per_worker

    cfg, task, data_dir, manifest = plan.cfg, plan.task, plan.data_dir, plan.info.manifest
    in_memory = fits_in_memory(data_dir, "train", cfg.data.in_memory_max_mb, manifest=manifest)
    source = "memory" if in_memory else "stream"
    datasets, views = {}, None
    if source == "stream":
        datasets, views = train_streams(
            data_dir,
            task.columns,
            task.stream_transform(),
            task.epoch_transform(),
            epochs=cfg.train.epochs,
            fraction=cfg.data.train_fraction,
            seed=cfg.train.seed,
            num_cpus=cfg.data.transform_cpus,
            concurrency=cfg.data.transform_concurrency,
            shards_at=data_location(cfg.data.path) if cfg.data.path else None,  # a URI: read from the store
            manifest=manifest,
        )
    storage = storage_root(cfg, storage_path)
    name = run_name(cfg, run_name_override)
    loop_config = {
        "cfg": cfg.to_dict(),
        # as configured (absolute): each node resolves it (a URI's copy, a WebDataset folder's index: local_dataset)
        "data_dir": plan.location,
        "source": source,
        "epoch_boards": None if views is None else {split: v.board.token for split, v in views.items()},
        "resume_from": str(resume_from) if resume_from else None,
        "run_dir": None if is_uri(storage) else str(Path(storage) / name),
        "stop_file": join(storage, name, STOP_FILE),
    }
    # Ray Train reads the start timeout from the environment of the process that calls fit(); a start that
    # times out is a controller failure, retried CONTROLLER_RETRIES times: together about capacity_wait_s
    os.environ[START_TIMEOUT_ENV] = f"{cfg.train.capacity_wait_s / (CONTROLLER_RETRIES + 1):g}"
    os.environ.setdefault(POLL_INTERVAL_ENV, f"{POLL_INTERVAL_S:g}")
    elastic_callbacks = [FreshCapacityOnRestart()] if isinstance(worker_range(cfg), tuple) else []
    remote_env = storage_env() if is_uri(storage) or is_uri(cfg.data.path or "") else {}  # object storage
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(
            num_workers=worker_range(cfg),
            use_gpu=cfg.train.use_gpu,
            resources_per_worker={"CPU": cfg.train.cpus_per_worker},
            elastic_resize_monitor_interval_s=cfg.train.elastic_resize_check_s,
        ),
        run_config=RunConfig(
            name=name,
            storage_path=storage,
            failure_config=FailureConfig(
                max_failures=failure_retries(cfg.train), controller_failure_limit=CONTROLLER_RETRIES
            ),
            checkpoint_config=CheckpointConfig(
                num_to_keep=cfg.train.keep_checkpoints,
                checkpoint_score_attribute=f"val/{task.primary_metric}",
                checkpoint_score_order="max",
            ),
            callbacks=[*(callbacks or []), *elastic_callbacks],
            worker_runtime_env={"env_vars": {**worker_env(cfg.train.tune_malloc), **remote_env}},
        ),
        datasets=datasets,
        dataset_config=DataConfig(datasets_to_split=list(datasets)),
    )


def worker_range(cfg: Config) -> int | tuple[int, int]:
    """``ScalingConfig(num_workers=...)``: ``train.num_workers`` for a fixed-size run, ``(train.min_workers,
    train.num_workers)`` for an elastic one (Ray Train starts once ``min`` workers fit, restarts with fewer from
    the latest checkpoint when a node goes, and grows back, again from the latest checkpoint, when capacity
    returns; it looks every ``train.elastic_resize_check_s`` seconds)."""
    t = cfg.train
    if t.min_workers is None or t.min_workers >= t.num_workers:
        return t.num_workers
    return (t.min_workers, t.num_workers)


def describe_workers(cfg: Config) -> str:
    """``2 Ray Train workers`` or ``1–3 Ray Train workers (elastic)`` for the console."""
    workers = worker_range(cfg)
    if isinstance(workers, tuple):
        return f"{workers[0]}–{workers[1]} Ray Train workers (elastic)"
    return f"{workers} Ray Train workers"


def run_training(
    cfg: Config,
    *,
    resume_from: str | None = None,
    evaluate_test: bool = True,
    address: str | None = None,
    force: bool = False,
) -> TrainOutcome:
    """Validate data, fit the TorchTrainer, evaluate the best checkpoint on the test split. Joins the Ray
    cluster at ``address`` (or ``RAY_ADDRESS``) when given, else starts a private local instance.

    A ``train.run_name`` that names an existing run continues it only when that run is unfinished and has
    this config (:func:`named_run_decision`; ``force`` starts it over). SIGINT/SIGTERM while training stops
    the run at the next step boundary with a checkpoint (``TrainOutcome.stopped``); a second one raises
    KeyboardInterrupt at once (:func:`raydist.train.stopping.stop_on_signals`)."""
    from ray.train import TrainingFailedError

    from raydist.retrieval.trained import resume_checkpoint
    from raydist.train.ray_worker import UNSCORED

    plan = prepare_run(cfg)
    cfg, data_dir = plan.cfg, plan.data_dir
    for line in plan.console_lines():
        say(f"[raydist] {line}")
    if resume_from:
        checked = str(resume_checkpoint(resume_from, cfg, data_dir))
        resume_from = resume_from if is_uri(resume_from) else checked  # a URI: the workers copy it
    else:
        _continue_or_start_named_run(cfg, data_dir, force=force)
    if is_uri(storage_root(cfg)):
        check_bucket(storage_root(cfg))
    if cfg.train.num_workers == 0:
        outcome = train_in_process(plan, resume_from=resume_from)
        return _finish(outcome, plan, evaluate_test)
    joining = address or os.environ.get("RAY_ADDRESS")
    say(
        f"[raydist] {'joining the Ray cluster at ' + joining if joining else 'starting a local Ray instance'} …"
    )
    startup = {"data_checked": time.time()}
    started = time.perf_counter()
    # one run needs no State API (runtime.start_local_ray); the config's plugins reach every Ray process
    init_ray(run_cpus(cfg), address, dashboard=False, plugins=cfg.plugins)
    if not joining:
        start_train_coordinator()
    name = run_name(cfg)
    storage = storage_root(cfg)
    capacity = cluster_capacity()
    check_storage_reachable(storage, cfg.train.storage_shared, capacity)
    check_cluster_fits(run_cpus(cfg, fewest=True), capacity)
    startup["ray_ready"] = time.time()
    say(f"[raydist] Ray ready in {time.perf_counter() - started:.1f} s; starting {describe_workers(cfg)} …")
    local_run = cache_path(join(storage, name)) if is_uri(storage) else Path(storage) / name  # a URI: a copy
    route_ray_output(local_run / LOG_FILE)
    trainer = build_trainer(plan, resume_from=resume_from, run_name_override=name)
    try:
        with stop_on_signals(join(storage, name, STOP_FILE)):
            result = _fit_off_main_thread(trainer)
    except TrainingFailedError as e:
        raise training_failure(e, cfg, None if is_uri(storage) else str(Path(storage) / name)) from e
    returned = result.return_value if isinstance(result.return_value, dict) else {}
    task = plan.task
    metric = f"val/{task.primary_metric}"
    best_ckpt = result.get_best_checkpoint(metric, "max") if result.best_checkpoints else None
    best_metrics = next(
        (m for c, m in result.best_checkpoints if best_ckpt and c.path == best_ckpt.path), None
    )
    if (
        best_metrics is not None and best_metrics.get(metric, UNSCORED) <= UNSCORED
    ):  # no validated checkpoint yet
        best_ckpt = best_metrics = None
    outcome = TrainOutcome(
        run_dir=location_of(result.filesystem, str(result.path)),
        best_checkpoint=location_of(best_ckpt.filesystem, best_ckpt.path) if best_ckpt else None,
        best_metrics=best_metrics,
        latest_checkpoint=location_of(result.checkpoint.filesystem, result.checkpoint.path)
        if result.checkpoint
        else None,
        history=returned.get("history", []),
        resumed_at=returned.get("resumed_at", []),
        columns=task.history_columns(),
        first_step_unix=returned.get("first_step_unix"),
        best_by=metric,
        stopped=bool(returned.get("stopped")),
        startup={**startup, **returned.get("startup", {})},
    )
    return _finish(outcome, plan, evaluate_test)


def _fit_off_main_thread(trainer: Any) -> Any:
    """``trainer.fit()`` in a helper thread while the main thread waits. On the main thread, Ray Train's fit
    replaces the SIGINT handler with its own (abort the run, no checkpoint, exit 1); off it, the handler of
    :func:`raydist.train.stopping.stop_on_signals` stays in charge, and the main thread's short waits let it
    run as soon as a signal comes."""
    box: dict[str, Any] = {}

    def fit() -> None:
        try:
            box["result"] = trainer.fit()
        except Exception as e:  # noqa: BLE001  (re-raised on the main thread)
            box["error"] = e

    thread = threading.Thread(target=fit, name="raydist-fit", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
    if "error" in box:
        raise box["error"]
    return box["result"]


@dataclass
class ExistingRun:
    """A run folder that a new run's ``train.run_name`` names, as its newest checkpoint describes it."""

    run_dir: Path | str  # a local folder, or its URI on object storage
    checkpoint: Path  # the newest checkpoint (a remote run's: its local copy)
    epoch: int  # epochs done
    step: int  # global steps done
    finished: bool  # its last epoch (or its early stop) is done
    changes: list[str]  # ``key: saved -> new`` for each key whose value the new config changes


def existing_run(cfg: Config) -> ExistingRun | None:
    """The run that ``cfg``'s ``train.run_name`` names under its storage, compared with ``cfg`` (resolved,
    as :func:`run_training` runs it); None for an unnamed run or a folder without a checkpoint. On object
    storage the run's checkpoints are copied first (:func:`raydist.checkpoint.local_folder`).
    ``train.storage_path`` is not compared: it is how the folder was found."""
    storage = storage_root(cfg)
    if not cfg.train.run_name:
        return None
    run_dir: Path | str = Path(storage) / cfg.train.run_name
    local = run_dir
    if is_uri(storage):
        run_dir = join(storage, cfg.train.run_name)
        if not remote_checkpoints(run_dir):
            return None
        local = local_folder(run_dir)
    checkpoint = newest_checkpoint(local)
    if checkpoint is None:
        return None
    state, saved, folder = load_checkpoint(checkpoint)
    saved = saved.model_copy(deep=True)
    saved.train.storage_path = cfg.train.storage_path
    loop = state.get("loop", {})
    epoch, step = int(loop.get("epoch", 0)), int(loop.get("global_step", 0))
    finished = bool(loop.get("finished")) or epoch >= saved.train.epochs
    return ExistingRun(run_dir, folder, epoch, step, finished, change_lines(saved, cfg))


def named_run_decision(cfg: Config, *, force: bool = False) -> tuple[str, ExistingRun | None]:
    """What a new run named ``train.run_name`` does with the run already there (checked before Ray starts):
    ``("new", None)`` when there is none, ``("resume", run)`` when it is unfinished and has exactly this
    config, ``("restart", run)`` with ``force``. Anything else is refused with a ConfigError: a finished run
    (``--force`` starts it over, or choose a new name) and a changed config (its ``changed:`` line as
    ``--resume`` prints it; continue it with ``--resume RUN key=value ...``, or choose a new name)."""
    run = existing_run(cfg)
    if run is None:
        return "new", None
    if force:
        return "restart", run
    name = cfg.train.run_name
    if run.finished:
        raise ConfigError(
            f"run {name!r} ({run.run_dir}) is finished ({run.epoch} epochs, {run.step} steps): use --force to "
            "start it over, or choose a new --name"
        )
    if run.changes:
        raise ConfigError(
            f"run {name!r} ({run.run_dir}) was started with another config; {format_changes(run.changes)}\n"
            f"to continue it with these changes: raydist train --resume {run.run_dir} key=value ...; or choose "
            "a new --name (or --force to start it over)"
        )
    return "resume", run


def _continue_or_start_named_run(cfg: Config, data_dir: Path, *, force: bool) -> None:
    """Act on :func:`named_run_decision`: say which run continues (after the data-fit check of
    :func:`raydist.retrieval.trained.resume_checkpoint`), or remove the folder of a run ``force`` starts over."""
    from raydist.retrieval.trained import resume_checkpoint

    action, run = named_run_decision(cfg, force=force)
    if run is None:
        return
    name = cfg.train.run_name
    if action == "resume":
        resume_checkpoint(run.checkpoint, cfg, data_dir)
        say(f"[raydist] resuming {name} at epoch {run.epoch + 1} (step {run.step}) from {run.checkpoint}")
        return
    if isinstance(run.run_dir, str):  # on object storage: the stored folder and its local copy
        delete(run.run_dir)
        shutil.rmtree(cache_path(run.run_dir), ignore_errors=True)
        say(f"[raydist] --force: starting {name} over (removed {run.run_dir})")
        return
    storage = Path(storage_root(cfg)).resolve()
    if storage not in run.run_dir.resolve().parents:
        raise ConfigError(f"--force: {run.run_dir} is not a run folder inside {storage}; remove it by hand")
    shutil.rmtree(run.run_dir)
    say(f"[raydist] --force: starting {name} over (removed {run.run_dir})")


def training_failure(error: Exception, cfg: Config | None = None, run_dir: str | None = None) -> Exception:
    """One line for the user from a failed fit: the first worker's error (its last line), where the full
    log is, and the kind: a ConfigError (bad input, exit 2) when a worker refused its config or data,
    otherwise a RuntimeError (a failed run, exit 1). Workers that waited ``train.capacity_wait_s`` for their
    resources in vain (a fixed-size run after a node loss) get their own line, with how to continue the run
    in ``run_dir``."""
    from raydist.data import RaydistDataError

    failures = getattr(error, "worker_failures", None) or {}
    first = next(iter(failures.values()), None) or getattr(error, "controller_failure", None) or error
    cause = getattr(first, "cause", None) or first  # RayTaskError wraps the worker's exception
    lines = [line.strip() for line in str(cause).strip().splitlines() if line.strip()]
    message = f"{lines[-1] if lines else type(cause).__name__} (full log: {_session_log_dir()})"
    if type(cause).__name__ == "WorkerGroupStartupTimeoutError" and cfg is not None:  # Ray's private class
        again = (
            "the same command continues it"
            if cfg.train.run_name
            else f"raydist train --resume {run_dir} continues it"
            if run_dir
            else ""
        )
        message = (
            f"{describe_workers(cfg)} did not get their CPUs/GPUs within train.capacity_wait_s="
            f"{cfg.train.capacity_wait_s:g} s (a node was lost, or the cluster is too small): add nodes or raise "
            "train.capacity_wait_s, or let the run shrink with train.min_workers"
            + (f"; the run keeps its checkpoints, and {again}" if again else "")
            + f" (full log: {_session_log_dir()})"
        )
    if isinstance(cause, (ConfigError, RaydistDataError)):
        return ConfigError(message)
    timed_out = type(cause).__name__ == "WorkerGroupStartupTimeoutError"
    if cfg is not None and cfg.train.num_workers and not failure_retries(cfg.train) and not timed_out:
        message += "; train.max_failures=3 would have restarted the run from its last checkpoint" + (
            ""
            if cfg.train.min_workers is not None
            else " (with train.min_workers set it also shrinks to the workers left)"
        )
    return RuntimeError(f"training failed: {message}")


def _session_log_dir() -> str:
    """The Ray session's log folder (worker stdout/stderr and Train controller logs)."""
    try:
        import ray

        return str(Path(ray._private.worker.global_worker.node.get_logs_dir_path()))
    except (AttributeError, RuntimeError):  # no local node (a remote cluster): Ray's default location
        return "/tmp/ray/session_latest/logs"


def train_in_process(
    plan: RunPlan,
    *,
    resume_from: str | None = None,
    run_dir: Path | None = None,
    on_report: ReportListener | None = None,
    shared: SharedSplit | None = None,
) -> TrainOutcome:
    """``train.num_workers=0``: the run ``plan`` describes, with the same loop in this process and no Ray
    (raydist.train.local.LocalRuntime); the run folder (``run_dir``, default ``storage/run_name``) holds its
    checkpoints, and a run restarted under its name resumes. ``on_report(metrics, checkpoint)`` hears every
    report (a Tune trial forwards them); ``shared``: a train split already read and decoded
    (:class:`raydist.train.local.SharedSplit`)."""
    import torch

    from raydist.train.local import LocalRuntime
    from raydist.train.loop import run_loop
    from raydist.train.wiring import build_hooks

    cfg, task = plan.cfg, plan.task
    step = plan.step_plan()
    if run_dir is None:
        storage = storage_root(cfg)
        if is_uri(storage):
            raise ValueError(f"train.num_workers=0 writes to a local folder, not {storage}")
        run_dir = Path(storage) / run_name(cfg)
    device = "cuda" if cfg.train.use_gpu and torch.cuda.is_available() else "cpu"
    runtime = LocalRuntime(
        cfg, task, step, run_dir, device, keep=cfg.train.keep_checkpoints, on_report=on_report, shared=shared
    )
    with stop_on_signals(run_dir / STOP_FILE):
        result = run_loop(
            cfg,
            task,
            runtime,
            step,
            hooks=build_hooks(cfg, task, runtime, str(run_dir)),
            resume_from=resume_from,
        )
    best = runtime.best_checkpoint()
    return TrainOutcome(
        run_dir=str(run_dir),
        best_checkpoint=str(best) if best else None,
        best_metrics=next(
            (r for r in runtime.reports if best and r["step"] == int(best.name.split("_")[-1])), None
        ),
        latest_checkpoint=str(runtime.checkpoints[-1]) if runtime.checkpoints else None,
        history=result["history"],
        resumed_at=result["resumed_at"],
        columns=task.history_columns(),
        first_step_unix=result["first_step_unix"],
        best_by=f"val/{task.primary_metric}",
        stopped=result["stopped"],
    )


def _finish(outcome: TrainOutcome, plan: RunPlan, evaluate_test: bool) -> TrainOutcome:
    """Evaluate the best checkpoint on the test split; write ``history.json``, ``best_checkpoint.json``
    (:func:`raydist.checkpoint.record_best_checkpoint`) and the plots (raydist.plots.plot_run) into a local
    run folder."""
    from raydist.checkpoint import record_best_checkpoint
    from raydist.plots import plot_run
    from raydist.retrieval.trained import evaluate_checkpoint

    outcome.data_dir = str(plan.data_dir)
    if (
        evaluate_test
        and not outcome.stopped
        and outcome.best_checkpoint
        and "test" in plan.info.manifest.splits
    ):
        outcome.test_metrics = evaluate_checkpoint(
            outcome.best_checkpoint, plan.data_dir, "test", data=plan.info
        )
    if is_uri(outcome.run_dir):  # the same records, on object storage (no plots there)
        write_bytes(join(outcome.run_dir, HISTORY_FILE), json.dumps(outcome.history, indent=1).encode())
        if outcome.best_checkpoint and outcome.best_by:
            record = record_best_checkpoint(
                local_folder(outcome.run_dir),
                outcome.best_checkpoint,
                outcome.best_by,
                (outcome.best_metrics or {}).get(outcome.best_by),
            )
            write_bytes(join(outcome.run_dir, record.name), record.read_bytes())
    else:  # per-epoch metrics next to the checkpoints
        Path(outcome.run_dir, HISTORY_FILE).write_text(json.dumps(outcome.history, indent=1))
        if outcome.best_checkpoint and outcome.best_by:
            record_best_checkpoint(
                outcome.run_dir,
                outcome.best_checkpoint,
                outcome.best_by,
                (outcome.best_metrics or {}).get(outcome.best_by),
            )
        plot_run(outcome.run_dir)
    return outcome


# the start-up marks of a run in order and their names on the console and in `raydist bench startup`: the CLI adds
# imports (and launch) and first_step to TrainOutcome.startup
STARTUP_PHASES = (
    ("imports", "imports"),
    ("data_checked", "data checked"),
    ("ray_ready", "Ray ready"),
    ("workers_started", "workers started"),
    ("data_ready", "data ready"),
    ("first_step", "first step"),
)


def format_startup(marks: dict[str, float], launch: float) -> str:
    """``imports 2.9 s, data checked 3.4 s, …``: the seconds from ``launch`` to each mark of
    :data:`STARTUP_PHASES` that ``marks`` (``time.time()`` values) holds."""
    return ", ".join(
        f"{title} {marks[key] - launch:.1f} s" for key, title in STARTUP_PHASES if marks.get(key) is not None
    )


def format_history(history: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """Per-epoch table: epoch, step, train loss, samples/s, the workers when they changed during the run (an
    elastic run that resized) and the task's validation columns (``Task.history_columns``)."""
    resized = len({m.get("world") for m in history}) > 1
    head = f"{'epoch':>5} {'step':>6} {'phase':>5} {'loss':>9} {'samples/s':>10}" + (
        f" {'workers':>7}" if resized else ""
    )
    lines = [head + "".join(f" {title:>8}" for _, title in columns)]
    for m in history:
        row = (
            f"{m['epoch']:>5} {m['step']:>6} {m.get('phase') or '-':>5} {m['train/loss']:>9.4f} "
            f"{m['train/samples_per_s']:>10.0f}"
        )
        row += f" {m.get('world', '-'):>7}" if resized else ""
        lines.append(row + "".join(f" {m.get('val/' + key, float('nan')):>8.1f}" for key, _ in columns))
    return "\n".join(lines)
