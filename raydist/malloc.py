"""glibc malloc thresholds for a training process.

A CPU training step allocates and frees the same large tensors (activations, gradients) every step. With
glibc's defaults much of that memory goes back to the kernel between steps (a heap trimmed at its top, a
thread arena's 64 MiB heap unmapped once empty, chunks above the dynamic mmap threshold), and every step
faults it back in page by page. A Ray Train worker runs the loop in a thread of its own, whose arena is not
the main one, and it paid 2–3× the page faults of the same loop in a plain process (thousands of 4 KiB
faults per step of the default preset; ``raydist bench step`` prints them).

:func:`tune_malloc` fixes the two thresholds instead: memory freed at the top of a heap is kept up to
:data:`TRIM_BYTES`, and only blocks of :data:`MMAP_BYTES` (glibc's own ceiling for the dynamic threshold) or
more are mmapped on their own. Freed memory is then reused by the next step. The cost is memory kept by the
process instead of returned: at most :data:`TRIM_BYTES` per arena. A thread arena's heaps are still capped at
64 MiB and unmapped when empty, so :func:`worker_env` also gives Ray Train's worker processes one arena
(``MALLOC_ARENA_MAX=1``, in their runtime environment: it must be set when a process starts): the loop's
thread then allocates from the main heap, as a plain process does. Off glibc (macOS, musl) both do nothing.
"""

from __future__ import annotations

import ctypes
import sys

# mallopt(3) parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
TRIM_BYTES = 256 << 20
MMAP_BYTES = 32 << 20  # the largest value glibc accepts on 64-bit (HEAP_MAX_SIZE / 2)


def _glibc() -> ctypes.CDLL | None:
    """This process's C library when it is glibc, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc only: musl has no such symbol)
        return libc
    except (OSError, AttributeError):
        return None


def on_glibc() -> bool:
    """Whether this process runs on glibc (where both settings apply)."""
    return _glibc() is not None


def worker_env(enabled: bool = True) -> dict[str, str]:
    """Environment variables for Ray Train's worker processes (``RunConfig.worker_runtime_env``; they reach
    workers on a cluster too): one malloc arena per process; empty when not ``enabled`` or off glibc."""
    return {"MALLOC_ARENA_MAX": "1"} if enabled and on_glibc() else {}


def tune_malloc(trim_bytes: int = TRIM_BYTES, mmap_bytes: int = MMAP_BYTES) -> bool:
    """Set glibc's trim and mmap thresholds for this process (all threads; fixed values also turn off
    glibc's dynamic adjustment of both). Returns whether they were set (False off glibc)."""
    libc = _glibc()
    if libc is None:
        return False
    trimmed = libc.mallopt(M_TRIM_THRESHOLD, trim_bytes)
    return bool(trimmed) and bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_bytes))
