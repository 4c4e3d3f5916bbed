"""Where a run executes: start a private local Ray instance or join the cluster asked for, check that the
run fits its CPUs, and resolve storage paths/URIs and run names."""

from __future__ import annotations

import math
import os
import socket
import time
import uuid
from pathlib import Path

from raydist.config import Config, ConfigError

# Logical CPUs that Ray Data needs beside the train workers, or the streaming pipeline waits forever.
DATA_CPUS = 1.0


def init_ray(cpus_needed: float, address: str | None = None) -> None:
    """Join the cluster named by ``address`` or ``RAY_ADDRESS`` (as inside ``ray job submit``); otherwise
    start a private local instance sized for the run. Never joins another process's instance unasked."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True, logging_level=_ray_log_level())
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private instance on this machine only
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
        logging_level=_ray_log_level(),
        runtime_env={"env_vars": {"RAY_API_SERVER_ADDRESS": api}},
    )


def _ray_log_level() -> int:
    """Ray's driver-side log level: INFO with ``-v``, else WARNING (the run's log file has everything)."""
    import logging

    from raydist.console import is_verbose

    return logging.INFO if is_verbose() else logging.WARNING


def run_cpus(cfg: Config) -> float:
    """Logical CPUs one training run occupies (workers + Ray Data)."""
    return max(cfg.train.num_workers, 1) * cfg.train.cpus_per_worker + DATA_CPUS


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


def is_uri(path: str) -> bool:
    """``s3://``, ``gs://`` ... rather than a local path."""
    return "://" in path


def storage_root(cfg: Config, override: str | None = None) -> str:
    """The storage path of runs: ``override``, else ``train.storage_path``, else ./runs; local paths are
    made absolute (Ray workers run in another directory)."""
    storage = override or cfg.train.storage_path or "runs"
    return storage if is_uri(storage) else str(Path(storage).expanduser().resolve())


def run_name(cfg: Config, override: str | None = None) -> str:
    """``override``, else ``train.run_name`` (a stable name resumes), else a fresh unique name."""
    return override or cfg.train.run_name or f"raydist-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
