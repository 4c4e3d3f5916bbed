"""`ray job submit` of jobs/train.py, jobs/eval.py and jobs/tune.py against a real `ray start` cluster.

The cluster is this module's own: its own --temp-dir (so its address file is not the default one that
`ray.init(address="auto")` reads), free ports, and its own process group, which teardown kills (never
`ray stop`, which stops every Ray instance on the machine). RAY_ADDRESS is set only in the job
clients' environment, and the cluster lives only while this module's test runs.
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from raydist.config import load_config
from raydist.runtime import ray_start_flags

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
]  # a cluster test is slow too (tests/conftest.py enforces it)

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).parent / "ray")


def _kill_group(pgid: int) -> None:
    """SIGTERM the cluster's process group, then SIGKILL what is left (the GCS outlives SIGTERM)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        time.sleep(1)


@pytest.fixture(scope="module")
def job_client_env():
    """Start a 4-CPU head node; yield the environment for `ray job` clients that talk to it."""
    temp_dir = tempfile.mkdtemp(prefix="rdj-", dir="/tmp")  # short: Ray's unix sockets live under it
    # the flags docs/clusters.md gives for a head beside another Ray (`raydist ray-ports`): the session's own
    # Ray may be up on this machine, and another Ray's agent ports must not be reused
    flags = [f for f in ray_start_flags() if not f.startswith("--temp-dir=")]
    ports = {f[2:].partition("=")[0]: int(f.partition("=")[2]) for f in flags}
    api_server = f"http://127.0.0.1:{ports['dashboard-port']}"
    # Every process of the cluster inherits this: Ray Train's placement-group cleaner then asks this
    # cluster's State API, instead of failing on "multiple active Ray instances" (the session's
    # in-process Ray may be up too) and leaking the workers' CPUs of an ASHA-stopped trial.
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_API_SERVER_ADDRESS": api_server,
    }
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen(
        [
            RAY,
            "start",
            "--head",
            "--num-cpus=4",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
            "--dashboard-host=127.0.0.1",
            "--include-dashboard=true",
            *(f"--{k}={v}" for k, v in ports.items()),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = head.communicate(timeout=120)
        assert head.returncode == 0, out
        yield {**env, "RAY_ADDRESS": api_server}
    finally:
        _kill_group(head.pid)  # `ray start` was the group leader; every Ray process it started is in it
        shutil.rmtree(temp_dir, ignore_errors=True)


def submit(env: dict, *job: str, timeout: float = 240) -> str:
    """`ray job submit --working-dir <repo> -- python <job...>`; returns the logs it streamed."""
    done = subprocess.run(
        [RAY, "job", "submit", "--working-dir", str(REPO), "--", "python", *job],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "succeeded" in out, out[-4000:]
    return out


def printed_path(out: str, label: str) -> Path:
    match = re.search(rf"^{label}:\s+(\S+)", out, re.MULTILINE)
    assert match, f"no '{label}:' line in the job logs:\n{out[-3000:]}"
    return Path(match.group(1))


@pytest.mark.timeout(600)
def test_train_eval_and_tune_jobs(job_client_env, tiny_dataset, tmp_path):
    data, runs = str(tiny_dataset), str(tmp_path / "runs")

    out = submit(
        job_client_env,
        "jobs/train.py",
        "--preset",
        "tiny",
        "--data",
        data,
        "--storage",
        runs,
        "train.epochs=1",
        "train.num_workers=1",
    )
    assert "== per-epoch metrics ==" in out and re.search(r"val rsum \d", out)
    checkpoint = printed_path(out, "best checkpoint")
    assert checkpoint.is_dir() and str(checkpoint).startswith(runs)

    out = submit(
        job_client_env, "jobs/eval.py", "--checkpoint", str(checkpoint), "--data", data, "--split", "val"
    )
    assert "rsum" in out and f"checkpoint {checkpoint}" in out

    out = submit(
        job_client_env,
        "jobs/tune.py",
        "--preset",
        "tiny",
        "--data",
        data,
        "--storage",
        runs,
        "--num-samples",
        "1",
        "tune_spaces/margin.yaml",
        "train.epochs=1",
        "train.num_workers=1",
    )
    assert "== sweep results ==" in out and "TERMINATED" in out
    experiment = printed_path(out, "experiment folder")
    assert experiment.is_dir() and str(experiment).startswith(runs)
    best = printed_path(out, "best config")
    assert load_config(preset_file=best).train.epochs == 1
    assert 0.05 <= yaml.safe_load(best.read_text())["loss"]["margin"] <= 0.4
