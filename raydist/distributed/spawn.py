"""Local multi-process runs without Ray (the benchmarks' torch.distributed references, the gloo tests): a free
TCP port for the rendezvous and spawned processes that leave without interpreter teardown."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (the OS's pick): a ``tcp://`` rendezvous, a server
    started next (Ray's listeners, Serve's HTTP proxy, the local S3 server)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def spawn(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """Run ``fn(rank, *args)`` in ``nprocs`` spawned processes and wait for all of them; an exception in one
    is raised here (as ``torch.multiprocessing.spawn`` does).

    A process whose ``fn`` returned leaves with ``os._exit(0)`` after flushing its output, skipping the
    interpreter's teardown: there, about one gloo run in twelve on the 2-core box aborted with "terminate
    called without an active exception" (a C++ thread still joinable while static objects are destroyed),
    after all its work was done."""
    mp.start_processes(_run_then_exit, args=(fn, *args), nprocs=nprocs, join=True, start_method="spawn")


def _run_then_exit(rank: int, fn: Callable[..., None], *args: Any) -> None:
    fn(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
