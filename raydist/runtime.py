"""Where a run executes: start a private local Ray instance or join the cluster asked for, check that the
run fits its CPUs, and resolve storage paths/URIs and run names."""

from __future__ import annotations

import math
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from raydist.config import Config, ConfigError

# Logical CPUs that Ray Data needs beside the train workers, or the streaming pipeline waits forever.
DATA_CPUS = 1.0
# RAY_API_SERVER_ADDRESS of a private instance without a dashboard: nothing listens on port 1 of this machine, so
# a State API call fails at once instead of finding another instance's API
NO_STATE_API = "http://127.0.0.1:1"


def init_ray(cpus_needed: float, address: str | None = None, *, dashboard: bool = True) -> None:
    """Join the cluster named by ``address`` or ``RAY_ADDRESS`` (as inside ``ray job submit``); otherwise
    start a private local instance sized for the run, with Ray's dashboard unless ``dashboard`` is False
    (:func:`start_local_ray`). Never joins another process's instance unasked."""
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
    start_local_ray(max(os.cpu_count() or 1, math.ceil(cpus_needed), 4), dashboard=dashboard)


def start_local_ray(num_cpus: int, *, log_to_driver: bool = True, dashboard: bool = True) -> None:
    """Start a private local Ray instance whose actors find its own State API, or none.

    Ray Train's placement-group cleaner looks the State API up by address; with two Ray instances on
    one machine that lookup fails ("multiple active Ray instances") and a stopped Tune trial never frees
    its workers' CPUs. Pinning ``RAY_API_SERVER_ADDRESS`` to this instance's dashboard avoids it.

    ``dashboard=False`` (one training run, ``raydist train``) starts no dashboard: Ray's dashboard is then one
    process with one module instead of twelve processes (its head, a fork server, a resource tracker and nine
    module processes), and no State API is served. Tune needs it (a stopped trial's workers are freed through
    it); one run does not: the cleaner acts only when the Train controller dies without cleaning up, and a
    private instance dies with this process. The cleaner still asks every second: ``RAY_API_SERVER_ADDRESS``
    then names :data:`NO_STATE_API`, so that it never reaches another instance's State API (auto-detection
    could find one, where our controller is unknown, i.e. dead to the cleaner, which would then remove our
    workers' placement group), and :func:`raydist.console.route_ray_output` leaves its warning that the State
    API cannot be reached out of the run's log.

    Ray's default start of one idle worker process per logical CPU is turned off
    (``prestart_worker_first_driver``): those processes have an empty runtime environment, while every task and
    actor here runs in another (the job's below; Ray Train's actors inherit their controller's), so none was
    ever used; ``ray.init`` waited for them to come up, and they took CPU from the processes that mattered.
    """
    import ray

    options: dict[str, Any] = {"include_dashboard": False}
    os.environ["RAY_API_SERVER_ADDRESS"] = NO_STATE_API
    if dashboard:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        api = f"http://127.0.0.1:{port}"
        os.environ["RAY_API_SERVER_ADDRESS"] = api
        options = {"dashboard_port": port, "runtime_env": {"env_vars": {"RAY_API_SERVER_ADDRESS": api}}}
    ray.init(
        address="local",
        num_cpus=num_cpus,
        log_to_driver=log_to_driver,
        logging_level=_ray_log_level(),
        _system_config={"prestart_worker_first_driver": False},
        **options,
    )


def start_train_coordinator() -> None:
    """Create Ray Train's autoscaling coordinator now, without waiting for it: a detached actor (one per
    instance, by name) that Train's controller otherwise creates on its way to the worker group and then waits
    for, up to 5 s, while its new process starts. Created here, that process starts while the driver builds the
    trainer and the controller's own process starts. For a private local instance (its actor process is
    nowhere else); a Ray without this internal module is left as it is."""
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )
    except ImportError:
        return
    get_or_create_autoscaling_coordinator()


def _ray_log_level() -> int:
    """Ray's driver-side log level: INFO with ``-v``, else WARNING (the run's log file has everything)."""
    import logging

    from raydist.console import is_verbose

    return logging.INFO if is_verbose() else logging.WARNING


def run_cpus(cfg: Config, *, fewest: bool = False) -> float:
    """Logical CPUs one training run occupies (workers + Ray Data); ``fewest``: with the fewest workers it may
    run with (``train.min_workers`` of an elastic run)."""
    workers = max(cfg.train.num_workers, 1)
    if fewest and cfg.train.min_workers is not None:
        workers = min(cfg.train.min_workers, workers)
    return workers * cfg.train.cpus_per_worker + DATA_CPUS


def check_cluster_fits(cpus_needed: float) -> None:
    """Fail fast instead of waiting forever for resources that will never come."""
    import ray

    have = ray.cluster_resources().get("CPU", 0.0)
    if cpus_needed > have:
        raise ConfigError(
            f"this run needs {cpus_needed:g} logical CPUs (train workers × train.cpus_per_worker + "
            f"{DATA_CPUS:g} for Ray Data; an elastic run: train.min_workers workers) but the Ray cluster has "
            f"{have:g}: lower train.num_workers (or train.min_workers) or train.cpus_per_worker, or add nodes"
        )


def alive_nodes() -> int:
    """Nodes of the connected Ray cluster that are up now."""
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def check_storage_reachable(storage: str, shared: bool, nodes: int) -> None:
    """Refuse a run (or experiment) folder on a local path when the cluster has more than one node, unless it is
    declared shared (``train.storage_shared``: a folder every node mounts, e.g. NFS): workers on the other nodes
    write checkpoints there, and Ray would fail late and obscurely, when a worker reports its first one.
    ``nodes``: the cluster's nodes that are up (:func:`alive_nodes`)."""
    if nodes <= 1 or shared or is_uri(storage):
        return
    raise ConfigError(
        f"the Ray cluster has {nodes} nodes, but the run folder {storage} is on a local path that workers on the "
        "other nodes cannot see: pass --storage s3://BUCKET/PATH or gs://BUCKET/PATH, or --storage on a folder "
        "that every node mounts (NFS) together with --storage-shared (train.storage_shared=true)"
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
