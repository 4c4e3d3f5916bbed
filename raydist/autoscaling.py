"""Ray's autoscaler on one machine: a head started from a cluster YAML shaped like cluster.yaml
(``cluster.local.yaml``: Ray's fake multi-node provider, whose "nodes" are extra raylets on this machine), and
the drill run on it: a raydist command that needs more than the head, nodes added for it, optionally one
preempted (killed, as a spot instance is) once the run has registered a checkpoint, and nodes removed when idle.
``python -m raydist.autoscaling --config cluster.local.yaml -- tune margin --preset tiny ...``"""

from __future__ import annotations

import argparse
import contextlib
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

from raydist.runtime import NO_STATE_API
from raydist.simcluster import (
    HEAD_SYSTEM_CONFIG,
    TRAIN_WORKER_TITLE,
    cli_on_cluster,
    free_port,
    print_report,
    registered_checkpoint_step,
)

# The fake provider gives each node it starts this id (its head's is FAKE_HEAD_NODE_ID), through the environment
FAKE_NODE_ID_ENV = "RAY_OVERRIDE_NODE_ID_FOR_TESTING"
# The autoscaler's log lines for its launches (v1 and v2 write the same event) and its terminations: v1's event
# names the count, type and reason; v2 logs each instance's way to TERMINATED, the reason on its way to TERMINATING
ADDED = re.compile(r"Adding (\d+) node\(s\) of type (\S+)\.")
REMOVED_V1 = re.compile(r":event_summary:Removing (\d+) nodes of type (\S+) \((.*)\)\.")
TERMINATING_V2 = re.compile(
    r"Update instance (\S+)->TERMINATING \(id=([^,]+), type=([^,]+),[^)]*\)(?::\s*(.*))?"
)
TERMINATED_V2 = re.compile(r"Update instance \S+->TERMINATED \(id=([^,]+),")
START_WAIT_S = 120.0  # how long the head and its autoscaler may take to come up on a busy machine
# Autoscaler v2 for the head (as ray.cluster_utils.AutoscalingCluster starts it): it reconciles its instances with
# the nodes Ray sees, so a node that dies behind the provider's back (a preemption) is terminated and replaced at
# once; v1 keeps counting a fake node that never left its "uninitialized" state, and waits minutes
HEAD_ENV = {
    "RAY_enable_autoscaler_v2": "1",
    "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
    FAKE_NODE_ID_ENV: FAKE_HEAD_NODE_ID,
}


@dataclass
class LocalCluster:
    """A running autoscaling cluster: its GCS address, the environment for processes that use it, and the
    autoscaler's log."""

    address: str
    env: dict[str, str]
    monitor_log: Path

    def events(self) -> tuple[list[tuple[str, int]], list[tuple[str, int, str]]]:
        """The autoscaler's node launches ``(type, count)`` and removals ``(type, count, reason)`` so far."""
        try:
            text = self.monitor_log.read_text(errors="replace")
        except OSError:
            return [], []
        added = [(m.group(2), int(m.group(1))) for m in ADDED.finditer(text)]
        removed = [(m.group(2), int(m.group(1)), m.group(3)) for m in REMOVED_V1.finditer(text)]
        why = {
            m.group(2): (m.group(3), (m.group(4) or m.group(1)).strip())
            for m in TERMINATING_V2.finditer(text)
        }
        for m in TERMINATED_V2.finditer(text):
            kind, reason = why.get(m.group(1), ("?", "?"))
            removed.append((kind, 1, reason))
        return added, removed


def local_config(config: Path, gcs_address: str, idle_timeout_s: float | None = None) -> dict[str, Any]:
    """The cluster YAML with the head's GCS address filled in (the fake provider would assume port 6379) and,
    when given, another idle timeout."""
    cfg = yaml.safe_load(config.read_text())
    cfg["provider"] = {**cfg["provider"], "gcs_address": gcs_address}
    if idle_timeout_s is not None:
        cfg["idle_timeout_minutes"] = idle_timeout_s / 60
    return cfg


@contextlib.contextmanager
def autoscaling_cluster(config: Path, *, idle_timeout_s: float | None = None) -> Iterator[LocalCluster]:
    """Start a head node with the autoscaler of ``config`` (its head type's CPUs), on free ports and in a
    temporary folder of its own; stop every process of it (the nodes the autoscaler started too) at the end."""
    from ray.util import get_node_ip_address

    temp_dir = tempfile.mkdtemp(prefix="rauto-", dir="/tmp")  # short: Ray's unix sockets live under it
    ip, port = get_node_ip_address(), free_port()
    cfg = local_config(config, f"{ip}:{port}", idle_timeout_s)
    head_cpus = int(cfg["available_node_types"][cfg["head_node_type"]]["resources"].get("CPU", 0))
    config_copy = Path(temp_dir) / "cluster.yaml"
    config_copy.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env.update(
        {
            "RAY_FAKE_CLUSTER": "1",
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_TMPDIR": temp_dir,
            # no dashboard (a dozen fewer processes on a small machine), so no State API: Ray Train's placement-group
            # cleaner must not find another instance's (raydist.runtime.start_local_ray)
            "RAY_API_SERVER_ADDRESS": NO_STATE_API,
            "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",  # the Train controller sees a lost worker sooner
        }
    )
    head = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            f"--port={port}",
            f"--num-cpus={head_cpus}",
            f"--autoscaling-config={config_copy}",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
            "--include-dashboard=false",
            f"--dashboard-port={free_port()}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--system-config={json.dumps(HEAD_SYSTEM_CONFIG, separators=(',', ':'))}",
        ],
        env={**env, **HEAD_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = head.communicate(timeout=START_WAIT_S)
        if head.returncode != 0:
            raise RuntimeError(f"ray start failed:\n{out[-3000:]}")
        cluster = LocalCluster(address=f"{ip}:{port}", env=env, monitor_log=_monitor_log(temp_dir))
        yield cluster
    finally:
        _stop(head.pid, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _monitor_log(temp_dir: str) -> Path:
    """The autoscaler's log, once it has written its first status (its config was accepted)."""
    deadline = time.monotonic() + START_WAIT_S
    log = Path(temp_dir) / "session_latest" / "logs" / "monitor.log"
    text = ""
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            text = log.read_text(errors="replace")
            if "Autoscaler status" in text or "setting max workers for head node type" in text:  # v1, v2
                return log
            if "Traceback" in text:
                raise RuntimeError(f"the autoscaler did not start ({log}):\n{text[-3000:]}")
        time.sleep(0.5)
    with contextlib.suppress(OSError):
        text = log.read_text(errors="replace")
    raise RuntimeError(f"the autoscaler wrote no status within {START_WAIT_S:.0f} s ({log}):\n{text[-3000:]}")


def _stop(pgid: int, temp_dir: str) -> None:
    """SIGKILL the head's process group, then any process left that belongs to this cluster (the autoscaler's
    nodes name the cluster's folder in their command lines)."""
    import psutil

    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if proc.pid != os.getpid() and temp_dir in " ".join(proc.info["cmdline"] or []):
                proc.kill()


def preempt_train_node() -> str | None:
    """Kill every process of one autoscaler-started node that hosts a Ray Train worker, as when a spot instance
    is reclaimed: first what its raylet started (a worker would go on training for a while), then the raylet.
    Returns the node's id, or None when no such node hosts a worker now (the head's workers are never chosen)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if not " ".join(proc.info["cmdline"] or []).startswith(TRAIN_WORKER_TITLE):
                continue
            raylet = proc.parent()
            node_id = raylet.environ().get(FAKE_NODE_ID_ENV) if raylet else None
            if not node_id or node_id == FAKE_HEAD_NODE_ID:
                continue
            for child in raylet.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
            raylet.kill()
            return node_id
    return None


@dataclass
class AutoscalingReport:
    """What happened in a drill: the command's exit code (None: killed at the timeout) and output, the
    autoscaler's launches and removals, and the preemption (``time.time()``, the checkpoint step before it)."""

    returncode: int | None
    wall_s: float = 0.0
    added: list[tuple[str, int]] = field(default_factory=list)
    removed: list[tuple[str, int, str]] = field(default_factory=list)
    preempted_node: str | None = None
    preempted_at: float | None = None
    checkpoint_step: int | None = None
    ended_at: float | None = None
    all_removed_s: float | None = None  # seconds from the command's end until every added node was removed
    cluster_up_s: float | None = None
    output: list[str] = field(default_factory=list)
    output_times: list[float] = field(default_factory=list)


def run_dirs_with_checkpoint(storage: Path) -> list[tuple[Path, int]]:
    """Ray Train run folders under ``storage`` (a sweep's trials' ``train`` folders too) with a registered
    checkpoint, and its step."""
    found = []
    for snapshot in storage.glob("**/checkpoint_manager_snapshot.json"):
        step = registered_checkpoint_step(snapshot.parent)
        if step is not None:
            found.append((snapshot.parent, step))
    return found


def autoscaling_drill(
    command: Sequence[str],
    *,
    config: Path,
    preempt_in: Path | None = None,
    idle_timeout_s: float | None = None,
    timeout: float = 600,
    keep_log: Path | None = None,
) -> AutoscalingReport:
    """Run ``raydist COMMAND --address CLUSTER`` on an autoscaling cluster started from ``config``; once a run
    under ``preempt_in`` has registered a checkpoint, preempt a node hosting one of its Train workers; after the
    command, wait (within ``timeout``) until the autoscaler has removed every node it added. ``keep_log``: where
    to copy the autoscaler's log before the cluster's folder is removed."""
    started = time.time()
    report = AutoscalingReport(returncode=None)
    with autoscaling_cluster(config, idle_timeout_s=idle_timeout_s) as cluster:
        proc = subprocess.Popen(
            cli_on_cluster(command, cluster.address),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=cluster.env,
            start_new_session=True,
        )
        report.cluster_up_s = round(time.time() - started, 1)

        def read() -> None:
            for line in proc.stdout:
                report.output.append(line.rstrip("\n"))
                report.output_times.append(time.time())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = started + timeout
        try:
            while preempt_in is not None and report.preempted_at is None and proc.poll() is None:
                if time.time() > deadline:
                    break
                checkpoints = run_dirs_with_checkpoint(preempt_in)
                node = preempt_train_node() if checkpoints else None
                if node:
                    report.preempted_node, report.preempted_at = node, time.time()
                    report.checkpoint_step = max(step for _, step in checkpoints)
                time.sleep(0.2)
            with contextlib.suppress(subprocess.TimeoutExpired):
                report.returncode = proc.wait(timeout=max(deadline - time.time(), 1))
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            reader.join(5)
        report.ended_at = time.time()
        while time.time() < deadline:
            added, removed = cluster.events()
            if sum(r[1] for r in removed) >= sum(n for _, n in added):
                report.all_removed_s = round(time.time() - report.ended_at, 1)
                break
            time.sleep(1.0)
        report.added, report.removed = cluster.events()
        if keep_log is not None:
            shutil.copyfile(cluster.monitor_log, keep_log)
    report.wall_s = round(time.time() - started, 1)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m raydist.autoscaling --config cluster.local.yaml [--preempt-in RUNS] -- tune margin ...``"""
    p = argparse.ArgumentParser(prog="python -m raydist.autoscaling", description=__doc__)
    p.add_argument("--config", type=Path, default=Path("cluster.local.yaml"), help="the cluster YAML")
    p.add_argument(
        "--preempt-in",
        type=Path,
        help="once a run under this folder has a checkpoint, kill a node hosting a Train worker",
    )
    p.add_argument("--idle-timeout-s", type=float, help="override the YAML's idle_timeout_minutes")
    p.add_argument("--timeout", type=float, default=900, help="give up after this many seconds")
    p.add_argument("--report", type=Path, help="write the drill's report here as JSON")
    p.add_argument("--keep-log", type=Path, help="copy the autoscaler's monitor.log here at the end")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the raydist command, after --")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    report = autoscaling_drill(
        command,
        config=args.config,
        preempt_in=args.preempt_in,
        idle_timeout_s=args.idle_timeout_s,
        timeout=args.timeout,
        keep_log=args.keep_log,
    )
    return print_report(report, "autoscaling", args.report)


if __name__ == "__main__":
    sys.exit(main())
