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

``Optimizer.step`` is ``profile_hook_step(_use_grad(step))``, and ``_use_grad`` imports
``torch._dynamo`` on every call, for two graph breaks that do nothing outside compilation.
``step_without_compiler`` runs the same hooks wrapper around the undecorated step, under the
grad mode ``_use_grad`` sets, and sets the LR scheduler's "the optimizer stepped" flag as the
scheduler's own wrapper does: the same update, hooks and profiler range, without the import.
Where the layers are not the ones described here (another torch) it calls ``step()``.
"""

from __future__ import annotations

import sys

import torch

WRAPPED_METHODS = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def optimizers_without_compiler() -> None:
    if "torch._dynamo" in sys.modules:
        return
    for name in WRAPPED_METHODS:
        original = getattr(getattr(torch.optim.Optimizer, name, None), "__wrapped__", None)
        if callable(original) and getattr(original, "__dynamo_disable", None) is None:
            setattr(original, "__dynamo_disable", original)  # noqa: B010 (a dunder-looking name, set as torch reads it)


def _use_grad_code() -> object:
    from torch.optim import optimizer

    make = getattr(optimizer, "_use_grad_for_differentiable", None)
    return getattr(make(lambda self: None), "__code__", None) if callable(make) else None


_USE_GRAD_CODE = _use_grad_code()


def step_without_compiler(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()``, without importing torch's compiler if nothing has yet."""
    hooked = type(optimizer).step
    use_grad = getattr(hooked, "__wrapped__", None)
    undecorated = getattr(use_grad, "__wrapped__", None)
    if (
        "torch._dynamo" in sys.modules
        or not getattr(hooked, "hooked", False)
        or _USE_GRAD_CODE is None
        or getattr(use_grad, "__code__", None) is not _USE_GRAD_CODE
        or not callable(undecorated)
    ):
        optimizer.step()
        return

    def step_in_grad_mode(*args: object, **kwargs: object) -> object:
        with torch.set_grad_enabled(bool(optimizer.defaults.get("differentiable", False))):
            return undecorated(*args, **kwargs)

    torch.optim.Optimizer.profile_hook_step(step_in_grad_mode)(optimizer)
    if getattr(optimizer.step, "_wrapped_by_lr_sched", False):
        optimizer._opt_called = True  # type: ignore[attr-defined]  # torch leaves undeclared the flag its LR-scheduler wrapper sets
