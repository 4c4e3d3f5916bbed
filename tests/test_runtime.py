"""raydist.runtime: without RAY_ADDRESS/--address every run starts a private Ray instance, so two runs
started at once on one machine both finish (joining one shared instance killed the second run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from raydist.config import load_config
from raydist.runtime import is_uri, run_name, storage_root


@pytest.mark.cluster  # each `raydist train` starts a private Ray instance of its own (not the session's)
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_concurrent_runs_both_finish(tiny_dataset, tmp_path):
    """Two `raydist train` processes started together: each its own private Ray instance and run folder, both
    finish (one Train worker each: the claim is about the instances, not the worker group)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    procs = []
    for i in range(2):
        cmd = [
            sys.executable,
            "-m",
            "raydist.cli",
            "train",
            "--preset",
            "tiny",
            "--data",
            str(tiny_dataset),
            "--storage",
            str(tmp_path / "runs"),
            "--json",
            str(tmp_path / f"run{i}.json"),
            "train.epochs=1",
            "train.num_workers=1",
            f"train.seed={i}",
        ]
        log = open(tmp_path / f"run{i}.log", "w")  # noqa: SIM115  (closed with the process below)
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    for proc, log in procs:
        proc.wait(timeout=380)
        log.close()
    for i, (proc, _) in enumerate(procs):
        text = (tmp_path / f"run{i}.log").read_text()
        assert proc.returncode == 0, text[-3000:]
        outcome = json.loads((tmp_path / f"run{i}.json").read_text())
        assert outcome["test_metrics"]["rsum"] > 0
        assert "[raydist] epoch 1/1 done" in text
    dirs = {json.loads((tmp_path / f"run{i}.json").read_text())["run_dir"] for i in range(2)}
    assert len(dirs) == 2


def test_storage_and_run_names(tmp_path):
    cfg = load_config("tiny")
    assert storage_root(cfg, "s3://bucket/runs") == "s3://bucket/runs" and is_uri("gs://x")
    assert storage_root(cfg, str(tmp_path / "r")) == str((tmp_path / "r").resolve())
    assert run_name(cfg, "mine") == "mine" and run_name(cfg).startswith("raydist-")
    assert run_name(cfg) != run_name(cfg)


def test_ray_ports_give_every_listener_a_free_port_and_a_temp_dir_of_its_own(capsys):
    import socket

    from raydist.cli import main
    from raydist.runtime import RAY_PORT_FLAGS, ray_start_flags

    flags = dict(f[2:].partition("=")[::2] for f in ray_start_flags(dashboard_port=8266))
    assert set(flags) == {*RAY_PORT_FLAGS, "temp-dir"} and flags["dashboard-port"] == "8266"
    ports = [int(flags[k]) for k in RAY_PORT_FLAGS if k != "dashboard-port"]
    assert len(set(ports)) == len(ports) and flags["temp-dir"] == f"/tmp/ray-{flags['port']}"
    for port in ports:  # free now: each binds
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert main(["ray-ports"]) == 0 and capsys.readouterr().out.count("--") == len(RAY_PORT_FLAGS) + 1


def test_joining_an_address_nobody_listens_on_fails_at_once_with_one_line():
    import time

    from raydist.config import ConfigError
    from raydist.distributed.spawn import free_port
    from raydist.runtime import check_reachable

    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(
        ConfigError, match=f"cannot join the Ray cluster at {address}: .*refused.*raydist ray-ports"
    ):
        check_reachable(address)
    assert time.monotonic() - started < 5
    check_reachable("auto")  # other forms are Ray's to resolve
