"""A multi-node Ray cluster simulated on one machine (``ray.cluster_utils.Cluster``: a head and worker nodes,
each with its own raylet) and the node-loss drill run on it: ``python -m raydist.simcluster``."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raydist.checkpoint import has_state
from raydist.console import say
from raydist.distributed.spawn import free_port
from raydist.runfiles import STEPS_FILE

# Faster failure detection: the GCS declares a killed node dead after ~5 missed 1-s health checks instead of
# 5 missed 3-s ones; a slow but live node still has Ray's 10-s timeout per check.
HEAD_SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}
TRAIN_WORKER_TITLE = "ray::RayTrainWorker"  # the process title Ray gives a Train worker actor
NODE_START_WAIT_S = 120.0  # how long a node may take to register with the cluster


@contextlib.contextmanager
def simulated_cluster(nodes: int, *, node_cpus: int = 1, head_cpus: int = 0) -> Iterator[Any]:
    """A head with ``head_cpus`` CPUs (0: no worker is placed there, so every worker is on a removable node) and
    ``nodes`` worker nodes of ``node_cpus`` CPUs each; every process of it is stopped when the block ends.

    The cluster keeps its sessions, sockets and address file in a temporary folder of its own (``RAY_TMPDIR``,
    set in this process and inherited by what it starts), removed at the end: ``ray.init(address="auto")``
    elsewhere on the machine never finds it, and its shutdown never deletes another cluster's address file."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    temp_dir = tempfile.mkdtemp(prefix="rsim-", dir="/tmp")  # short: Ray's unix sockets live under it
    saved_tmpdir = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp_dir
    from ray.cluster_utils import Cluster

    cluster = Cluster()
    try:
        # no dashboard (fewer processes to start on a small machine); its API server still starts: on a free port
        add_node(
            cluster,
            num_cpus=head_cpus,
            include_dashboard=False,
            dashboard_port=free_port(),
            _system_config=HEAD_SYSTEM_CONFIG,
        )
        for _ in range(nodes):
            add_node(cluster, num_cpus=node_cpus)
        cluster.wait_for_nodes(timeout=NODE_START_WAIT_S)
        yield cluster
    finally:
        cluster.shutdown()
        if saved_tmpdir is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved_tmpdir
        shutil.rmtree(temp_dir, ignore_errors=True)


def add_node(cluster: Any, **node_args: Any) -> Any:
    """``cluster.add_node``, waiting up to :data:`NODE_START_WAIT_S` for the node to register instead of Ray's
    fixed 30 s, which a busy 2-core machine can miss (the node's raylet and agents start slowly there)."""
    from ray._private import services

    get_node = services.get_node

    def patient_get_node(gcs_address: str, node_id: str) -> Any:
        deadline = time.monotonic() + NODE_START_WAIT_S
        while True:
            try:
                return get_node(gcs_address, node_id)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    services.get_node = patient_get_node
    try:
        node = cluster.add_node(wait=False, **node_args)
    finally:
        services.get_node = get_node
    services.wait_for_node(node.gcs_address, node.plasma_store_socket_name, NODE_START_WAIT_S)
    return node


def node_processes(node: Any) -> list[Any]:
    """The processes the node's raylet started (workers, agents), as psutil processes."""
    import psutil
    from ray._private import ray_constants

    raylet = node.all_processes.get(ray_constants.PROCESS_TYPE_RAYLET)
    if not raylet:
        return []
    try:
        return psutil.Process(raylet[0].process.pid).children()
    except psutil.NoSuchProcess:
        return []


def train_worker_nodes(cluster: Any) -> list[Any]:
    """The cluster's worker nodes that host a Ray Train worker now (found among its raylet's child processes)."""
    import psutil

    def hosts_a_worker(node: Any) -> bool:
        for child in node_processes(node):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if " ".join(child.cmdline()).startswith(TRAIN_WORKER_TITLE):
                    return True
        return False

    return [node for node in list(cluster.worker_nodes) if hosts_a_worker(node)]


def kill_node(cluster: Any, node: Any) -> None:
    """Every process of ``node`` killed at once, as when its machine dies: first what its raylet started (a
    worker outlives a killed raylet by seconds, and would go on training), then the raylet and the rest."""
    import psutil

    for child in node_processes(node):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    cluster.remove_node(node, allow_graceful=False)


def registered_checkpoint_step(run_dir: Path) -> int | None:
    """The global step of the latest checkpoint Ray Train's controller has registered for the run in
    ``run_dir`` (its checkpoint-manager snapshot names it once the folder is persisted), None before any."""
    snapshot = run_dir / "checkpoint_manager_snapshot.json"
    try:
        latest = json.loads(snapshot.read_text()).get("latest_checkpoint_result")
    except (OSError, ValueError):  # not there yet, or being written
        return None
    if not latest or not has_state(run_dir / latest["checkpoint_dir_name"]):
        return None
    return int(latest.get("metrics", {}).get("step", 0))


def steps_logged(run_dir: Path) -> int:
    """The last step in the run's ``steps.jsonl`` (0 before any)."""
    try:
        lines = (run_dir / STEPS_FILE).read_text().splitlines()
    except OSError:
        return 0
    steps = [json.loads(line)["step"] for line in lines if line.strip().endswith("}")]
    return max(steps, default=0)


@dataclass
class DrillReport:
    """What happened in a drill: the command's exit code (None: killed at the timeout) and output, and when
    (``time.time()``) the nodes went and came back."""

    returncode: int | None
    wall_s: float
    cluster_up_s: float | None = None  # seconds the simulated cluster took to start
    output: list[str] = field(default_factory=list)
    checkpoint_step: int | None = None  # the registered checkpoint that set off the removal
    steps_at_removal: int | None = None  # steps.jsonl's last step right after the removal
    removed_at: float | None = None
    removed_workers: int = 0  # nodes removed (each hosting a Train worker)
    added_back_at: float | None = None
    ended_at: float | None = None  # the command's exit (or kill)
    output_times: list[float] = field(default_factory=list)  # when each output line came
    steps_run: int = (
        0  # optimizer steps rank 0 reported (progress lines; `train.log_every=1` counts them all)
    )
    restarts: list[dict[str, Any]] = field(default_factory=list)  # :func:`restarts`
    test_rsum: float | None = None  # the test table's rsum line, when the run printed one


PROGRESS = re.compile(r"\[raydist\] epoch (\d+)/\d+ step (\d+)/(\d+) ")
TEST_RSUM = re.compile(r"^rsum\s+([0-9.]+)\s*$")


def progress_steps(lines: Sequence[str], times: Sequence[float]) -> list[tuple[float, int]]:
    """``(time, global step)`` of each progress line (``[raydist] epoch E/N step i/S``: step (E−1)·S + i)."""
    found = []
    for t, line in zip(times, lines, strict=False):
        m = PROGRESS.search(line)
        if m:
            epoch, step, per_epoch = (int(g) for g in m.groups())
            found.append((t, (epoch - 1) * per_epoch + step))
    return found


def restarts(steps: Sequence[tuple[float, int]]) -> list[dict[str, Any]]:
    """Every place where the step count goes back (a restart from a checkpoint): the last step before it
    (``from_step``), the first after it (``to_step``), the steps done again (``redone``) and the seconds
    between those two steps' ends (``gap_s``: detection, teardown, the new workers' start and the restore)."""
    found = []
    for (t0, a), (t1, b) in itertools.pairwise(steps):
        if b <= a:
            found.append({"from_step": a, "to_step": b, "redone": a - b + 1, "gap_s": round(t1 - t0, 1)})
    return found


def cli_on_cluster(command: Sequence[str], address: str) -> list[str]:
    """The argv of ``raydist COMMAND --address ADDRESS`` in this Python (the drills' driver process)."""
    return [
        sys.executable,
        "-c",
        "import sys; from raydist.cli import main; sys.exit(main())",
        *command,
        "--address",
        address,
    ]


def node_loss_drill(
    command: Sequence[str],
    *,
    nodes: int,
    node_cpus: int = 1,
    run_dir: Path | None = None,
    remove: int = 1,
    add_back_after: float | None = None,
    timeout: float = 600,
) -> DrillReport:
    """Run ``raydist COMMAND --address CLUSTER`` on a simulated cluster of ``nodes`` worker nodes; once the run
    in ``run_dir`` has registered its first checkpoint, remove ``remove`` nodes that host Train workers (their
    processes are killed, as when a machine dies); ``add_back_after`` seconds later, add as many nodes again.
    The command is killed after ``timeout`` seconds (``returncode`` None)."""
    started = time.time()
    with simulated_cluster(nodes, node_cpus=node_cpus) as cluster:
        cluster_up_s = time.time() - started
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
        env.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")  # the controller sees a lost worker sooner
        proc = subprocess.Popen(
            cli_on_cluster(command, cluster.address),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        report = DrillReport(returncode=None, wall_s=0.0, cluster_up_s=round(cluster_up_s, 1))

        def read() -> None:
            for line in proc.stdout:
                report.output.append(line.rstrip("\n"))
                report.output_times.append(time.time())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = started + timeout
        try:
            if run_dir is not None and remove:
                _remove_after_checkpoint(cluster, proc, run_dir, remove, deadline, report)
            if report.removed_at is not None and add_back_after is not None:
                _sleep_while_running(proc, report.removed_at + add_back_after)
                if proc.poll() is None:
                    for _ in range(report.removed_workers):
                        add_node(cluster, num_cpus=node_cpus)
                    report.added_back_at = time.time()
            with contextlib.suppress(subprocess.TimeoutExpired):
                report.returncode = proc.wait(timeout=max(deadline - time.time(), 1))
        finally:
            if proc.poll() is None:  # the command's own process group: its driver and nothing else
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            report.ended_at = time.time()
            reader.join(5)
    report.wall_s = time.time() - started
    steps = progress_steps(report.output, report.output_times)
    report.steps_run, report.restarts = len(steps), restarts(steps)
    rsums = [float(m.group(1)) for m in map(TEST_RSUM.match, report.output) if m]
    report.test_rsum = rsums[-1] if rsums else None
    return report


def _remove_after_checkpoint(
    cluster: Any, proc: subprocess.Popen, run_dir: Path, remove: int, deadline: float, report: DrillReport
) -> None:
    """Wait for the run's first registered checkpoint, then remove ``remove`` nodes hosting Train workers."""
    while time.time() < deadline and proc.poll() is None:
        step = registered_checkpoint_step(run_dir)
        hosts = train_worker_nodes(cluster) if step is not None else []
        if hosts:
            for node in hosts[:remove]:
                kill_node(cluster, node)
            report.checkpoint_step, report.removed_at = step, time.time()
            report.removed_workers = len(hosts[:remove])
            time.sleep(1.0)  # rank 0 may still be writing the line of the last step that completed
            report.steps_at_removal = steps_logged(run_dir)
            return
        time.sleep(0.2)


def _sleep_while_running(proc: subprocess.Popen, until: float) -> None:
    while time.time() < until and proc.poll() is None:
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m raydist.simcluster --nodes 3 --run-dir RUNS/NAME -- train --storage RUNS --name NAME ...``"""
    p = argparse.ArgumentParser(prog="python -m raydist.simcluster", description=__doc__)
    p.add_argument("--nodes", type=int, default=3, help="worker nodes (the head has no CPUs)")
    p.add_argument("--node-cpus", type=int, default=1, help="logical CPUs of each worker node (whole)")
    p.add_argument("--run-dir", type=Path, help="the run folder to watch for its first checkpoint")
    p.add_argument("--remove", type=int, default=1, help="nodes (hosting Train workers) to remove after it")
    p.add_argument("--add-back-after", type=float, help="seconds after the removal to add the nodes back")
    p.add_argument("--timeout", type=float, default=600, help="kill the command after this many seconds")
    p.add_argument("--report", type=Path, help="write the drill's report here as JSON")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the raydist command, after --")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    report = node_loss_drill(
        command,
        nodes=args.nodes,
        node_cpus=args.node_cpus,
        run_dir=args.run_dir,
        remove=args.remove,
        add_back_after=args.add_back_after,
        timeout=args.timeout,
    )
    return print_report(report, "simcluster", args.report)


def print_report(report: Any, tag: str, path: Path | None) -> int:
    """Print a drill's command output and a one-line JSON summary ``[tag] {...}`` (without the output), write the
    whole report to ``path`` when given; the exit code: 0 when the command succeeded."""
    say("\n".join(report.output))
    summary = {k: v for k, v in asdict(report).items() if k not in ("output", "output_times")}
    say(f"[{tag}] {json.dumps(summary)}")
    if path:
        path.write_text(json.dumps(asdict(report), indent=1))
    return 0 if report.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
