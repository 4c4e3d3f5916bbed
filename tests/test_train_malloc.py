"""train.tune_malloc: with glibc's thresholds fixed, memory a thread frees is reused by its next allocations
instead of being returned to the kernel and faulted back in (counted with getrusage's minor faults, in fresh
processes: the thresholds are process-wide and sticky)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from raydist.config import load_config
from raydist.train.malloc import _glibc

# In a fresh process, optionally tuned: a non-main thread (as a Ray Train worker's loop) allocates 5 × 8 MiB,
# writes every page and frees them, 12 times; prints the minor page faults of each round.
ROUNDS = """
import ctypes, json, resource, sys, threading
if sys.argv[1] == "tuned":
    from raydist.train.malloc import tune_malloc
    assert tune_malloc()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
faults = []
def rounds():
    for _ in range(12):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [libc.malloc(8 << 20) for _ in range(5)]
        for b in blocks:
            libc.memset(b, 1, 8 << 20)
        for b in blocks:
            libc.free(b)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
thread = threading.Thread(target=rounds)
thread.start()
thread.join()
print(json.dumps(faults))
"""
PAGES_PER_ROUND = 5 * (8 << 20) // 4096


def fault_rounds(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", ROUNDS, mode], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(_glibc() is None, reason="mallopt thresholds are glibc's")
def test_tuned_thread_reuses_freed_memory_instead_of_faulting_it_back() -> None:
    default, tuned = fault_rounds("default"), fault_rounds("tuned")
    # glibc's defaults: the freed 40 MiB leave the thread's heap every round and come back page by page
    assert min(default[1:]) > 0.9 * PAGES_PER_ROUND
    # tuned: only the first round faults its pages in; the later rounds reuse them
    assert tuned[0] > 0.9 * PAGES_PER_ROUND
    assert max(tuned[1:]) < 0.01 * PAGES_PER_ROUND


def test_tune_malloc_is_on_by_default_and_can_be_turned_off() -> None:
    assert load_config("default").train.tune_malloc is True
    assert load_config("default", overrides={"train.tune_malloc": False}).train.tune_malloc is False
