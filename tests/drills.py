"""Run a drill module (`python -m raydist.simcluster`, `python -m raydist.autoscaling`) in a subprocess of its own
session, killed as a group if it outlives its timeout, and read the report it writes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest


def run_drill(module: str, *args: str, report: Path, timeout: float) -> dict:
    """``python -m MODULE ARGS --report REPORT``; the report, with the command's output joined as ``text``."""
    argv = [
        sys.executable,
        "-m",
        module,
        *args[: args.index("--")],
        "--report",
        str(report),
        *args[args.index("--") :],
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the drill outlived its timeout:\n{out[-4000:]}")
    assert report.is_file(), out[-4000:]
    result = json.loads(report.read_text())
    result["text"] = "\n".join(result.pop("output"))
    return result
