"""megatron-core on a machine without a GPU: the calls it hard-codes to CUDA, mapped to CPU.

megatron-core 0.16 runs its forward, backward and optimizer on CPU tensors over gloo, except
where it names the device itself. This layer covers those places and nothing else:

- ``torch.cuda.current_device()`` (rotary embeddings move their frequencies there, attention
  builds its masks there, the distributed optimizer sizes its buffers there) returns the CPU
  device;
- tensors created with ``device="cuda"`` (the schedules' token counters, the optimizer's
  scale and found-inf flags, the grad-norm buffers) and ``Tensor.cuda()`` stay on the CPU,
  and ``pin_memory`` is dropped (pinning needs CUDA); a ``TorchFunctionMode`` rewrites those
  calls while it is active;
- ``tensor.type()`` asked with no argument names the CUDA type of a CPU tensor
  (``torch.cuda.FloatTensor`` for ``torch.FloatTensor``): the distributed optimizer accepts
  only parameters whose type string says CUDA;
- the RNG-state tracker that forks a "CUDA" generator per parallel region tracks the CPU
  generator instead (``torch.cuda.get_rng_state`` / ``manual_seed`` and megatron's own
  get/set helpers).

``megatron_on_this_device()`` is what an engine wraps its megatron calls in: the layer when
CUDA is not available, nothing otherwise. The patches to ``torch.cuda`` and megatron's RNG
module are process-wide (an engine owns its worker process) and installed once;
``tests/unit/megatron`` fails if a megatron release moves any of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_installed = False


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return False


class CudaCallsToCpu(TorchFunctionMode):
    """Keeps tensors that megatron asks to create or move onto CUDA on the CPU."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:  # a query, not a cast
            name = func(*args)
            return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def _cpu_device() -> torch.device:
    return torch.device("cpu")


def _seed_cpu(seed: int) -> None:
    torch.manual_seed(seed)


def install_cpu_patches() -> None:
    """Point ``torch.cuda``'s device and RNG calls and megatron's RNG helpers at the CPU (once)."""
    global _installed
    if _installed:
        return
    import megatron.core.tensor_parallel.random as megatron_random

    # torch types current_device as an int index; megatron passes it on as a device, here the CPU
    torch.cuda.current_device = _cpu_device  # type: ignore[assignment]
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.manual_seed = _seed_cpu
    megatron_random._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: torch.get_rng_state()
    megatron_random._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(new_state)
    _installed = True


@contextlib.contextmanager
def megatron_on_this_device() -> Iterator[None]:
    """Run megatron code here: as it is with CUDA, behind the CPU layer without it."""
    if torch.cuda.is_available():
        yield
        return
    install_cpu_patches()
    with CudaCallsToCpu():
        yield
