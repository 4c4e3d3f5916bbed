"""train.tune_malloc: with glibc's thresholds fixed, memory a thread frees is reused by its next allocations
instead of being returned to the kernel and faulted back in (counted with getrusage's minor faults, in fresh
processes: the thresholds are process-wide and sticky)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from raydist import malloc
from raydist.config import load_config
from raydist.malloc import on_glibc, tune_malloc, worker_env

# In a fresh process, optionally tuned: a non-main thread (as a Ray Train worker's loop) allocates BLOCKS × 8 MiB,
# writes every page and frees them, 12 times; prints the minor page faults of each round.
ROUNDS = """
import ctypes, json, resource, sys, threading
BLOCKS = int(sys.argv[2])
if sys.argv[1] == "tuned":
    from raydist.malloc import tune_malloc
    assert tune_malloc()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
faults = []
def rounds():
    for _ in range(12):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [libc.malloc(8 << 20) for _ in range(BLOCKS)]
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
PAGES_PER_BLOCK = (8 << 20) // 4096
PAGES_PER_ROUND = 5 * PAGES_PER_BLOCK


def fault_rounds(mode: str, blocks: int = 5, env: dict[str, str] | None = None) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", ROUNDS, mode, str(blocks)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


GLIBC_ONLY = "tune_malloc changes glibc's malloc; on other C libraries it does nothing (tested below)"


@pytest.mark.skipif(not on_glibc(), reason=GLIBC_ONLY)
def test_tuned_thread_reuses_freed_memory_instead_of_faulting_it_back() -> None:
    default, tuned = fault_rounds("default"), fault_rounds("tuned")
    # glibc's defaults: the freed 40 MiB leave the thread's heap every round and come back page by page
    assert min(default[1:]) > 0.9 * PAGES_PER_ROUND
    # tuned: only the first round faults its pages in; the later rounds reuse them
    assert tuned[0] > 0.9 * PAGES_PER_ROUND
    assert max(tuned[1:]) < 0.01 * PAGES_PER_ROUND


@pytest.mark.skipif(not on_glibc(), reason=GLIBC_ONLY)
def test_one_arena_keeps_a_rounds_memory_beyond_a_thread_heap() -> None:
    # 10 × 8 MiB do not fit one 64 MiB thread heap: the thread arena maps a second heap every round and
    # unmaps it once empty, thresholds or not; with one arena (worker_env) the thread uses the main heap
    blocks, env = 10, worker_env()
    assert env == {"MALLOC_ARENA_MAX": "1"}
    thread_arena, one_arena = fault_rounds("tuned", blocks), fault_rounds("tuned", blocks, env)
    assert min(thread_arena[1:]) > 2 * PAGES_PER_BLOCK
    assert max(one_arena[1:]) < 0.01 * blocks * PAGES_PER_BLOCK


def test_tune_malloc_is_on_by_default_and_can_be_turned_off() -> None:
    assert load_config("default").train.tune_malloc is True
    assert load_config("default", overrides={"train.tune_malloc": False}).train.tune_malloc is False


def test_ray_train_workers_get_the_arena_env_only_when_tuned(tmp_path) -> None:
    from raydist.data import make_synthetic
    from raydist.train.plan import prepare_run
    from raydist.train.trainer import build_trainer

    data = make_synthetic(
        tmp_path / "data", images=16, captions_per_image=2, dim=8, seed=0, val_images=4, test_images=4
    )
    for on in (True, False):
        cfg = load_config("tiny", overrides={"data.path": str(data), "train.tune_malloc": on})
        env = build_trainer(
            prepare_run(cfg), storage_path=str(tmp_path / "runs")
        ).run_config.worker_runtime_env["env_vars"]
        assert ("MALLOC_ARENA_MAX" in env) == (on and on_glibc())


def test_off_glibc_both_settings_do_nothing(monkeypatch) -> None:
    monkeypatch.setattr(malloc.sys, "platform", "darwin")
    assert not on_glibc()
    assert tune_malloc() is False
    assert worker_env() == {}
