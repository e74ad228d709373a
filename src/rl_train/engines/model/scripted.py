"""TorchScript for the per-token loops of the built-in rollout engine, where it is available.

A decode step of a small model is some hundred small kernels, and on the CPU the Python call
around each one (the interpreter, argument parsing, the module and attribute lookups) is a
measurable share of the step. The same function compiled by TorchScript calls the same
kernels on the same numbers, in the same order, from C++: at 256 rows of the demo's policy a
decode step took 0.80x the time, with the same logits bit for bit on the CPU
(``tests/unit/test_scripted.py``).

``scripted(fn)`` compiles ``fn`` once per process, or returns None where TorchScript cannot
(a torch without it, a source-less install) or where ``RL_TRAIN_TORCHSCRIPT=0`` says not to:
callers then run ``fn`` itself, which is the same computation.

Every call of a compiled function runs with TorchScript's optimizations off: the graph is
interpreted as written. The profiling executor would specialize it to the shapes it has seen,
take a slower path each time a batch of another size comes (a rollout worker's batches vary),
and on a GPU fuse kernels that round differently. Measured at 256 x 32 generations
interleaved with 1,024 x 4 ones: 73-76 ms a generation against 76-83 ms with the profiling
executor (by hand). The switch is per call, not per thread, because the executor keeps the
first plan it optimized and serves it afterwards whatever the thread's setting says.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)

SWITCH = "RL_TRAIN_TORCHSCRIPT"
"""Set to 0 to run the scripted functions from Python (the same numbers, slower)."""
_compiled: dict[Callable[..., Any], Callable[..., Any] | None] = {}
_lock = threading.Lock()


def scripted(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` compiled by TorchScript (once per process) and called interpreted, or None where
    it cannot be or ``RL_TRAIN_TORCHSCRIPT=0``."""
    try:
        return _compiled[fn]
    except KeyError:
        pass
    with _lock:
        if fn not in _compiled:
            _compiled[fn] = None if os.environ.get(SWITCH, "1") == "0" else _compile(fn)
        return _compiled[fn]


def _compile(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchScript's deprecation notice
            compiled = torch.jit.script(fn)
    except Exception as exc:  # any failure: the same function from Python
        logger.warning("%s runs from Python (TorchScript failed: %s)", fn.__qualname__, exc)
        return None

    def interpreted(*args: Any) -> Any:
        with torch.jit.optimized_execution(False):
            return compiled(*args)

    interpreted.__qualname__ = f"scripted({fn.__qualname__})"
    return interpreted
