"""Building an optimizer without importing torch's compiler.

torch wraps a few ``Optimizer`` methods (``add_param_group``, which the constructor calls,
``zero_grad``, ``state_dict``, ``load_state_dict``) in ``torch._disable_dynamo``: on its first
call the wrapper imports ``torch._dynamo`` to build a "do not compile this" version of the
method, and keeps it on the method as ``__dynamo_disable``. That import costs a training worker
about 1.7 s of CPU at start-up, when every worker of a run starts at once on the same cores,
and the engines here never compile anything, so the "do not compile" version is the method
itself.

``optimizers_without_compiler`` stores exactly that on those methods before the first
optimizer is built, unless ``torch._dynamo`` is already imported (then the wrapper's own
version is cheap and is left alone). If a later torch no longer reads that attribute the
setting is simply unused: optimizers behave as before, only the import comes back.

``Optimizer.step`` itself still imports ``torch._dynamo`` on its first call (for a graph
break). ``import_compiler_in_background`` therefore imports it on a thread once the engine
is built, while the first batch is being generated elsewhere, so that the first update does
not wait for it either: it leaves the start-up path rather than the process.
"""

from __future__ import annotations

import importlib
import sys
import threading

import torch

WRAPPED_METHODS = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def optimizers_without_compiler() -> None:
    if "torch._dynamo" in sys.modules:
        return
    for name in WRAPPED_METHODS:
        original = getattr(getattr(torch.optim.Optimizer, name, None), "__wrapped__", None)
        if callable(original) and getattr(original, "__dynamo_disable", None) is None:
            setattr(original, "__dynamo_disable", original)  # noqa: B010 (a dunder-looking name, set as torch reads it)


def import_compiler_in_background() -> threading.Thread:
    thread = threading.Thread(
        target=importlib.import_module, args=("torch._dynamo",), name="rl-train-import-dynamo", daemon=True
    )
    thread.start()
    return thread
