"""Where a run executes: start a private local Ray instance or join the cluster asked for, check that the
run fits its CPUs, and resolve storage paths/URIs and run names."""

from __future__ import annotations

import json
import math
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydist.config import Config, ConfigError
from raydist.console import quiet_ray_data_console, say
from raydist.distributed.spawn import free_port
from raydist.plugins import plugin_runtime_env
from raydist.uris import is_uri

# Logical CPUs that Ray Data needs beside the train workers, or the streaming pipeline waits forever.
DATA_CPUS = 1.0
# RAY_API_SERVER_ADDRESS of a private instance without a dashboard: nothing listens on port 1 of this machine, so
# a State API call fails at once instead of finding another instance's API
NO_STATE_API = "http://127.0.0.1:1"
# set by `ray job submit` in the job's driver: the job's config (its runtime_env among it), as JSON
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


# Every port a Ray node listens on (`ray start` flags). A second Ray on a machine needs all of them free: a taken
# dashboard-agent port, for one, leaves the head up but its job server answers "No available agent to submit job".
RAY_PORT_FLAGS = (
    "port",
    "dashboard-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "ray-client-server-port",
    "metrics-export-port",
    "runtime-env-agent-port",
    "node-manager-port",
    "object-manager-port",
)


def ray_start_flags(dashboard_port: int | None = None) -> list[str]:
    """``ray start`` flags for a node beside another Ray on this machine: a free port for every listener
    (:data:`RAY_PORT_FLAGS`; the dashboard's and job server's is ``dashboard_port`` when given) and a temp dir
    of its own (the default one's ``session_latest`` is the other Ray's)."""
    ports = {flag: free_port() for flag in RAY_PORT_FLAGS}
    if dashboard_port is not None:
        ports["dashboard-port"] = dashboard_port
    return [*(f"--{flag}={port}" for flag, port in ports.items()), f"--temp-dir=/tmp/ray-{ports['port']}"]


def join_failure(address: str, error: Exception) -> ConfigError:
    """One line for a cluster that cannot be joined: the address, Ray's reason, and what to check."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return ConfigError(
        f"cannot join the Ray cluster at {address}: {lines[-1] if lines else type(error).__name__} (is its head "
        "running? `ray status --address ADDRESS` tells; a head started beside another Ray on one machine needs "
        "free ports for all its listeners: ray start --head $(raydist ray-ports), docs/clusters.md)"
    )


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A ``HOST:PORT`` address (a head's GCS) must accept a TCP connection within ``timeout_s``: Ray's own
    ``ray.init`` retries an unreachable one for minutes without a word. Other forms (``auto``, ``ray://``)
    are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or "/" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise join_failure(address, e) from e


def init_ray(
    cpus_needed: float, address: str | None = None, *, dashboard: bool = True, plugins: Sequence[str] = ()
) -> None:
    """Join the cluster named by ``address`` or ``RAY_ADDRESS`` (as inside ``ray job submit``); otherwise
    start a private local instance sized for the run, with Ray's dashboard unless ``dashboard`` is False
    (:func:`start_local_ray`). Never joins another process's instance unasked. ``plugins``: shipped to every
    Ray process of this job (:func:`job_runtime_env`); a Ray started before is used as it is (a plugin file
    then reaches the processes on this machine only, by its path)."""
    import ray

    if ray.is_initialized():
        return
    runtime_env = job_runtime_env(plugins)
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        quiet_ray_data_console()
        check_reachable(address)
        try:
            ray.init(
                address=address,
                log_to_driver=True,
                logging_level=_ray_log_level(),
                **({"runtime_env": runtime_env} if runtime_env else {}),
            )
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise join_failure(address, e) from e
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private instance on this machine only
    # Logical CPUs are scheduling tokens: oversubscribing a small machine is fine for small models.
    start_local_ray(
        max(os.cpu_count() or 1, math.ceil(cpus_needed), 4), dashboard=dashboard, runtime_env=runtime_env
    )


def job_runtime_env(plugins: Sequence[str]) -> dict[str, Any]:
    """The job-level ``runtime_env`` that ships ``plugins`` (Ray's ``py_modules``: every node gets a copy,
    importable under the plugin's module name). Inside ``ray job submit``, whose job may carry ``py_modules``
    of its own, the job's are kept and ours added (Ray refuses the same field from both otherwise)."""
    env = plugin_runtime_env(plugins)
    job = os.environ.get(JOB_CONFIG_ENV)
    if env and job:
        job_modules = (json.loads(job).get("runtime_env") or {}).get("py_modules") or []
        if job_modules:
            env["py_modules"] = [*job_modules, *env["py_modules"]]
            os.environ["RAY_OVERRIDE_JOB_RUNTIME_ENV"] = "1"  # ours then holds both lists
    return env


def start_local_ray(
    num_cpus: int,
    *,
    log_to_driver: bool = True,
    dashboard: bool = True,
    runtime_env: dict[str, Any] | None = None,
) -> None:
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
    env = dict(runtime_env or {})
    os.environ["RAY_API_SERVER_ADDRESS"] = NO_STATE_API
    if dashboard:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        api = f"http://127.0.0.1:{port}"
        os.environ["RAY_API_SERVER_ADDRESS"] = api
        options = {"dashboard_port": port}
        env["env_vars"] = {**env.get("env_vars", {}), "RAY_API_SERVER_ADDRESS": api}
    if env:
        options["runtime_env"] = env
    quiet_ray_data_console()
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
    run with (``train.min_workers`` of an elastic run). In process (``train.num_workers=0``, no Ray Data):
    ``train.cpus_per_worker``."""
    if cfg.train.num_workers == 0:
        return cfg.train.cpus_per_worker
    workers = cfg.train.num_workers
    if fewest and cfg.train.min_workers is not None:
        workers = min(cfg.train.min_workers, workers)
    return workers * cfg.train.cpus_per_worker + DATA_CPUS


@dataclass(frozen=True)
class Capacity:
    """What the connected Ray cluster offers: logical CPUs and nodes up now, and the most CPUs its autoscaler
    may bring (``None``: no autoscaler; ``math.inf``: an autoscaler that does not publish its bound)."""

    cpus: float
    nodes: int
    max_cpus: float | None = None

    @property
    def autoscaling(self) -> bool:
        return self.max_cpus is not None


def cluster_capacity() -> Capacity:
    """The connected cluster's :class:`Capacity`. An autoscaler is found where Ray's own tools find it: a cluster
    config reported to the GCS names node types whose CPUs × max counts bound the cluster (what Ray Train checks a
    worker group against); autoscaler v2 without one (``RAY_enable_autoscaler_v2=1``, as raydist.autoscaling starts
    it: its standalone monitor reports none) sets its flag in the GCS; v1 (``ray up``, ``ray start
    --autoscaling-config``) writes only its status report, which ``ray status`` reads (:func:`v1_autoscaling`).
    The last two give no bound."""
    import ray
    from ray._private import ray_constants
    from ray._private.state import state
    from ray.autoscaler.v2.utils import is_autoscaler_v2
    from ray.experimental.internal_kv import _internal_kv_get

    cpus = ray.cluster_resources().get("CPU", 0.0)
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    bounds = state.get_max_resources_from_cluster_config()
    if bounds:
        return Capacity(cpus, nodes, float(bounds.get("CPU", 0)))
    if is_autoscaler_v2(
        fetch_from_server=True
    ):  # started with RAY_enable_autoscaler_v2=1: no bound published
        return Capacity(cpus, nodes, math.inf)
    status = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
    if status and v1_autoscaling(json.loads(status)):
        return Capacity(cpus, nodes, math.inf)
    return Capacity(cpus, nodes)


def v1_autoscaling(status: dict[str, Any]) -> bool:
    """Whether the v1 monitor's status report comes from an autoscaler with node types to launch. Every head runs
    that monitor; without an autoscaling config it watches a read-only provider that names each node's type
    ``node_<node id>`` after the node, and launches nothing."""
    from ray.autoscaler._private.util import format_readonly_node_type

    mapping = status.get("autoscaler_report", {}).get("node_type_mapping", {})
    return any(kind != format_readonly_node_type(node) for node, kind in mapping.items())


def check_fits(cpus_needed: float, capacity: Capacity, *, what: str, fix: str) -> None:
    """Fail fast instead of waiting forever for CPUs that will never come: refuse when ``cpus_needed`` is beyond
    what the cluster has (no autoscaler) or may grow to (an autoscaler's bound); say so when an autoscaler must add
    nodes first. ``what`` (e.g. "this run needs 3 logical CPUs (…)") and ``fix`` word the refusal."""
    if cpus_needed <= capacity.cpus:
        return
    if capacity.max_cpus is None:
        raise ConfigError(f"{what} but the Ray cluster has {capacity.cpus:g}: {fix}")
    if cpus_needed > capacity.max_cpus:
        raise ConfigError(
            f"{what} but the Ray cluster has {capacity.cpus:g} and its autoscaler adds nodes up to "
            f"{capacity.max_cpus:g}: {fix}"
        )
    bound = "" if math.isinf(capacity.max_cpus) else f" (up to {capacity.max_cpus:g})"
    say(
        f"[raydist] the Ray cluster has {capacity.cpus:g} logical CPUs now and {cpus_needed:g} are needed: waiting for "
        f"its autoscaler to add nodes{bound} (`ray status` shows them coming)"
    )


def check_cluster_fits(cpus_needed: float, capacity: Capacity) -> None:
    """:func:`check_fits` for one training run."""
    check_fits(
        cpus_needed,
        capacity,
        what=f"this run needs {cpus_needed:g} logical CPUs (train workers × train.cpus_per_worker + {DATA_CPUS:g} "
        "for Ray Data; an elastic run: train.min_workers workers)",
        fix="lower train.num_workers (or train.min_workers) or train.cpus_per_worker, or add nodes",
    )


def check_storage_reachable(storage: str, shared: bool, capacity: Capacity) -> None:
    """Refuse a run (or experiment) folder on a local path when the cluster has more than one node, or an
    autoscaler that adds them, unless it is declared shared (``train.storage_shared``: a folder every node mounts,
    e.g. NFS): workers on the other nodes write checkpoints there, and Ray would fail late and obscurely, when a
    worker reports its first one."""
    if not (capacity.nodes > 1 or capacity.autoscaling) or shared or is_uri(storage):
        return
    cluster = (
        f"has {capacity.nodes} nodes" if capacity.nodes > 1 else "adds nodes as it needs them (autoscaling)"
    )
    raise ConfigError(
        f"the Ray cluster {cluster}, but the run folder {storage} is on a local path that workers on the "
        "other nodes cannot see: pass --storage s3://BUCKET/PATH or gs://BUCKET/PATH, or --storage on a folder "
        "that every node mounts (NFS) together with --storage-shared (train.storage_shared=true)"
    )


def storage_root(cfg: Config, override: str | None = None) -> str:
    """The storage path of runs: ``override``, else ``train.storage_path``, else ./runs; local paths are
    made absolute (Ray workers run in another directory)."""
    storage = override or cfg.train.storage_path or "runs"
    return storage if is_uri(storage) else str(Path(storage).expanduser().resolve())


def run_name(cfg: Config, override: str | None = None) -> str:
    """``override``, else ``train.run_name`` (a stable name resumes), else a fresh unique name."""
    return (
        override or cfg.train.run_name or f"raydist-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    )
