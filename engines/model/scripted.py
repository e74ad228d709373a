"""TorchScript for the per-token loops of the built-in rollout engine, where it is available.

A decode step of a small model is some hundred small kernels, and on the CPU the Python call
around each one (the interpreter, argument parsing, the module and attribute lookups) is a
measurable share of the step. The same function compiled by TorchScript calls the same
kernels on the same numbers, in the same order, from C++: at 256 rows of the demo's policy a
decode step took 0.80x the time, with bitwise the same logits
(``tests/unit/test_native_decode.py``).

``scripted(fn)`` compiles ``fn`` once per process, or returns None where TorchScript cannot
(a torch without it, a source-less install) or where ``RL_TRAIN_TORCHSCRIPT=0`` says not to:
callers then run ``fn`` itself, which is the same computation. ``unoptimized()`` is the context to call such functions in: TorchScript's
profiling executor specializes a graph to the shapes it has seen and takes a slower path
each time a batch of another size comes (a rollout worker's batches vary); with its
optimizations off it interprets the graph as written, which here is all it would run anyway
(no fuser runs on the CPU). Measured at 256 x 32 generations interleaved with 1,024 x 4 ones:
73-76 ms a generation against 76-83 ms with the profiling executor.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

logger = logging.getLogger(__name__)

SWITCH = "RL_TRAIN_TORCHSCRIPT"
"""Set to 0 to run the scripted functions from Python (the same numbers, slower)."""
_compiled: dict[Callable[..., Any], Callable[..., Any] | None] = {}
_lock = threading.Lock()


def scripted(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` compiled by TorchScript (once per process), or None where it cannot be."""
    try:
        return _compiled[fn]
    except KeyError:
        pass
    with _lock:
        if fn not in _compiled and os.environ.get(SWITCH, "1") == "0":
            _compiled[fn] = None
        if fn not in _compiled:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # TorchScript's deprecation notice
                    _compiled[fn] = torch.jit.script(fn)
            except Exception as exc:  # any failure: the same function from Python
                logger.warning("%s runs from Python (TorchScript failed: %s)", fn.__qualname__, exc)
                _compiled[fn] = None
        return _compiled[fn]


def unoptimized() -> AbstractContextManager[None]:
    """The context (this thread only) in which scripted functions are interpreted as written."""
    return torch.jit.optimized_execution(False)
