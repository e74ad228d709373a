"""How a worker process's host memory allocator treats freed tensors (glibc's malloc).

A tiny policy's activations are a few MiB each. glibc hands out blocks that size with
``mmap`` until its adaptive threshold has grown past them, and gives the top of its heap back
to the OS as soon as more than twice that threshold lies free there. Either way the next
tensor of that size touches fresh pages: a page fault per 4 KiB, which cost more than the
kernel that writes them. A forward pass of 32 tool-task trajectories (130 tokens) on one
core met 6,602 page faults and took 63.8 ms; with the settings below it met none and took
47.6 ms, 0.75x (``python -m rl_train.bench.host_heap``; an update, 0.97x).
``tests/unit/test_host_memory.py`` holds rounds of such blocks to fewer than 50 faults (of
6,144 pages).

``keep_freed_memory`` pins the thresholds: blocks up to 32 MiB (glibc's largest threshold)
come from the heap, up to ``keep_mib`` of free heap stays mapped at the top of each malloc
arena (mallopt takes an int: at most 2,047 MiB), and the heap grows 64 MiB at a time. A worker that frees much at once on purpose (a rollout replica going to sleep)
calls ``release_freed_memory`` to give it back. ``RL_TRAIN_WORKER_HEAP_KEEP_MIB`` sets
``keep_mib`` for every worker started from this environment; ``0`` leaves glibc's defaults.
Elsewhere than glibc (musl, macOS) both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
from functools import cache

KEEP_ENV = "RL_TRAIN_WORKER_HEAP_KEEP_MIB"
DEFAULT_KEEP_MIB = 1024
"""Free heap a worker keeps mapped: a step's activations of the tool task are a few hundred MiB."""
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
"""glibc's largest mmap threshold on 64-bit: bigger blocks are mapped (and unmapped) alone."""
TOP_PAD_BYTES = 64 * 1024 * 1024
"""How far the heap grows past a request, so growing is rare."""
# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3


@cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def keep_mib_from_env(environ: dict[str, str] | None = None) -> int:
    """``RL_TRAIN_WORKER_HEAP_KEEP_MIB`` as a count of MiB (``DEFAULT_KEEP_MIB`` when unset);
    anything but a whole number >= 0 is refused, naming the variable and the value."""
    raw = (os.environ if environ is None else environ).get(KEEP_ENV, "").strip()
    if not raw:
        return DEFAULT_KEEP_MIB
    if not raw.isdigit():
        raise ValueError(
            f"{KEEP_ENV}: got {raw!r}: expected a whole number of MiB >= 0 (0: glibc's defaults)"
        )
    return int(raw)


def keep_freed_memory(keep_mib: int | None = None) -> bool:
    """Keep freed blocks of up to 32 MiB, and up to ``keep_mib`` MiB of free heap, for the
    process's next tensors (``None``: from the environment). True when glibc took the
    settings; False for ``keep_mib == 0`` or another C library."""
    keep = keep_mib_from_env() if keep_mib is None else keep_mib
    libc = _glibc()
    if keep <= 0 or libc is None:
        return False
    trim = min(keep * 1024 * 1024, 2**31 - 1)  # mallopt takes an int
    return all(
        libc.mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
            (_M_TRIM_THRESHOLD, trim),
            (_M_TOP_PAD, TOP_PAD_BYTES),
        )
    )


def release_freed_memory() -> bool:
    """Give the process's free heap pages back to the OS (``malloc_trim(0)``): what
    ``keep_freed_memory`` keeps, once a worker has freed much on purpose. True if any went."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def freeze_built_objects() -> int:
    """Collect what start-up left as garbage, then take the Python objects the process has
    built so far (modules, the engine, its model's parameters) out of the cyclic collector's
    generations (``gc.freeze``); returns how many were frozen.

    Why. Python's collector walks every tracked object of the oldest generation in a full
    collection, which the per-request lists of a rollout's results trigger every few batches.
    A rollout process holds some hundred thousand such objects after start-up, none of which
    will ever be garbage: at 1,024 prompts x 4 tokens every eighth generation met a full pass
    and took about three times as long (``python -m rl_train.bench.rollout --gc default``: its
    pairs' ratios reached down to 0.47x; ``--gc frozen``: 2.42-2.69x). The cost: a cycle that
    runs through a frozen object is never collected, only freed by reference counting, so
    this is for a process's own built state, once (a worker when its engines are up; not the
    spare rescue engine, which is built in a training rank's process mid-run)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
