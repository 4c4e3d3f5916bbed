"""Driver side of a training run: resolve data, start or join Ray, build the TorchTrainer, fit,
and summarise (per-epoch table, best checkpoint, test metrics)."""

from __future__ import annotations

import json
import math
import os
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydist.config import Config, ConfigError
from raydist.data import check_split_size, ensure_default_dataset, load_manifest, validate_dataset
from raydist.distributed import rows_per_worker

# Logical CPUs that Ray Data needs beside the train workers, or the streaming pipeline waits forever
# (RAY_NOTES.md, "CPU budget").
DATA_CPUS = 1.0
TRAIN_COLUMNS = ["image_id", "sample_id", "image", "caption"]


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


def resolve_data_dir(cfg: Config) -> Path:
    """The configured dataset folder (absolute), or the embedded default dataset (generated once)."""
    if cfg.data.path:
        return Path(cfg.data.path).expanduser().resolve()
    return ensure_default_dataset()


def rows_per_step(cfg: Config) -> int:
    """Rows all workers embed together in one step: the global batch, or a larger negative set."""
    workers = max(cfg.train.num_workers, 1)
    return workers * rows_per_worker(cfg.train.batch_size, cfg.loss.negative_set_size, workers)


def checked_data_dir(cfg: Config, configs: Iterable[Config] = ()) -> Path:
    """The dataset folder, fully validated, with a train split big enough for one step of ``cfg`` and of
    every config in ``configs`` (e.g. all trials of a sweep)."""
    data_dir = resolve_data_dir(cfg)
    validate_dataset(data_dir).raise_if_problems()
    check_split_size(data_dir, "train", max(rows_per_step(c) for c in (cfg, *configs)))
    return data_dir


def init_ray(cpus_needed: float) -> None:
    """Join the cluster a job runs in (RAY_ADDRESS) or start a local one sized for the run."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=True)
        return
    try:
        ray.init(address="auto", log_to_driver=True)
        return
    except ConnectionError:
        pass
    # Logical CPUs are scheduling tokens: oversubscribing a small machine is fine for small models.
    start_local_ray(max(os.cpu_count() or 1, math.ceil(cpus_needed), 4))


def start_local_ray(num_cpus: int, *, log_to_driver: bool = True) -> None:
    """Start a private local Ray instance whose actors find its own State API.

    Ray Train's placement-group cleaner looks the State API up by address; with two Ray instances on
    one machine that lookup fails ("multiple active Ray instances") and a stopped Tune trial never frees
    its workers' CPUs. Pinning ``RAY_API_SERVER_ADDRESS`` to this instance's dashboard avoids it.
    """
    import ray

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    api = f"http://127.0.0.1:{port}"
    os.environ["RAY_API_SERVER_ADDRESS"] = api
    ray.init(
        address="local",
        num_cpus=num_cpus,
        dashboard_port=port,
        log_to_driver=log_to_driver,
        runtime_env={"env_vars": {"RAY_API_SERVER_ADDRESS": api}},
    )


def check_cluster_fits(cpus_needed: float) -> None:
    """Fail fast instead of waiting forever for resources that will never come."""
    import ray

    have = ray.cluster_resources().get("CPU", 0.0)
    if cpus_needed > have:
        raise ConfigError(
            f"this run needs {cpus_needed:g} logical CPUs (train workers × train.cpus_per_worker + "
            f"{DATA_CPUS:g} for Ray Data) but the Ray cluster has {have:g}: lower train.num_workers or "
            "train.cpus_per_worker, or add nodes"
        )


def run_cpus(cfg: Config) -> float:
    """Logical CPUs one training run occupies (workers + Ray Data)."""
    return max(cfg.train.num_workers, 1) * cfg.train.cpus_per_worker + DATA_CPUS


def build_trainer(
    cfg: Config,
    data_dir: Path,
    *,
    resume_from: str | None = None,
    callbacks: list[Any] | None = None,
    run_name: str | None = None,
    storage_path: str | None = None,
) -> Any:
    """A ``TorchTrainer`` for ``cfg`` (gloo on CPU, nccl on GPU via ``train.use_gpu``)."""
    import ray.data
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raydist.data import split_files
    from raydist.train.loop import train_loop_per_worker

    manifest = load_manifest(data_dir)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # deterministic row order for a fixed seed
    ctx.enable_progress_bars = False
    train_ds = ray.data.read_parquet(split_files(data_dir, "train")).select_columns(TRAIN_COLUMNS)
    storage = storage_path or cfg.train.storage_path or str(Path("runs").resolve())
    if "://" not in storage:
        storage = str(Path(storage).expanduser().resolve())
    name = run_name or cfg.train.run_name or f"raydist-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    loop_config = {
        "cfg": cfg.to_dict(),
        "data_dir": str(data_dir),
        "feature_dim": manifest.feature_dim,
        "resume_from": str(resume_from) if resume_from else None,
        "marker_dir": str(Path(storage) / name) if "://" not in storage else None,
    }
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(
            num_workers=cfg.train.num_workers,
            use_gpu=cfg.train.use_gpu,
            resources_per_worker={"CPU": cfg.train.cpus_per_worker},
        ),
        run_config=RunConfig(
            name=name,
            storage_path=storage,
            failure_config=FailureConfig(max_failures=cfg.train.max_failures),
            checkpoint_config=CheckpointConfig(
                num_to_keep=cfg.train.keep_checkpoints,
                checkpoint_score_attribute="val/rsum",
                checkpoint_score_order="max",
            ),
            callbacks=callbacks or [],
        ),
        datasets={"train": train_ds},
        dataset_config=DataConfig(datasets_to_split=["train"]),
    )


def run_training(
    cfg: Config,
    *,
    resume_from: str | None = None,
    evaluate_test: bool = True,
) -> TrainOutcome:
    """Validate data, fit the TorchTrainer, evaluate the best checkpoint on the test split."""
    from ray.train import TrainingFailedError

    from raydist.eval.evaluate import evaluate_checkpoint
    from raydist.train.checkpoint import find_checkpoint

    data_dir = checked_data_dir(cfg)
    if resume_from:
        resume_from = str(find_checkpoint(resume_from))
    init_ray(run_cpus(cfg))
    check_cluster_fits(run_cpus(cfg))
    trainer = build_trainer(cfg, data_dir, resume_from=resume_from)
    try:
        result = trainer.fit()
    except TrainingFailedError as e:
        raise RuntimeError(f"training failed: {e}") from e
    returned = result.return_value if isinstance(result.return_value, dict) else {}
    best_ckpt, best_metrics = None, None
    if result.best_checkpoints:
        best_ckpt, best_metrics = max(result.best_checkpoints, key=lambda cm: cm[1].get("val/rsum", -1.0))
    outcome = TrainOutcome(
        run_dir=str(result.path),
        best_checkpoint=best_ckpt.path if best_ckpt else None,
        best_metrics=best_metrics,
        latest_checkpoint=result.checkpoint.path if result.checkpoint else None,
        history=returned.get("history", []),
        resumed_at=returned.get("resumed_at", []),
    )
    if evaluate_test and outcome.best_checkpoint and "test" in load_manifest(data_dir).splits:
        outcome.test_metrics = evaluate_checkpoint(outcome.best_checkpoint, data_dir, "test")
    if "://" not in outcome.run_dir:  # per-epoch metrics next to the checkpoints
        Path(outcome.run_dir, "history.json").write_text(json.dumps(outcome.history, indent=1))
    return outcome


def format_history(history: list[dict[str, Any]]) -> str:
    """Per-epoch table: epoch, step, train loss, samples/s, val R@1 (i2t, t2i), val rsum."""
    lines = [f"{'epoch':>5} {'step':>6} {'loss':>9} {'samples/s':>10} {'i2t R@1':>8} {'t2i R@1':>8} {'rsum':>7}"]
    for m in history:
        lines.append(
            f"{m['epoch']:>5} {m['step']:>6} {m['train/loss']:>9.4f} {m['train/samples_per_s']:>10.0f} "
            f"{m.get('val/i2t_r1', float('nan')):>8.1f} {m.get('val/t2i_r1', float('nan')):>8.1f} "
            f"{m.get('val/rsum', float('nan')):>7.1f}"
        )
    return "\n".join(lines)
