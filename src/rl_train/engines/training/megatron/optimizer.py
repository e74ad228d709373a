"""megatron-core's distributed optimizer around a ``GPTModel``, and one update with it.

The model is wrapped in megatron's ``DistributedDataParallel`` (contiguous grad buffers,
``use_distributed_optimizer``: each data-parallel rank keeps the optimizer state of its shard
of the parameters) and the optimizer comes from ``get_megatron_optimizer`` with the actor's
settings (Adam, lr, betas, weight decay, grad clip).

One update (``optimizer_step``), after ``schedule.forward_backward`` summed the micro-batches'
numerator gradients into the grad buffers:

1. ``finalize_model_grads`` with the rank's loss denominator: it sums the denominators over
   the data-parallel group, reduce-scatters the gradients and divides them once by that
   global denominator (R-4.3; the model config's ``calculate_per_token_loss`` makes DDP sum
   rather than average);
2. the optimizer step: grad-norm clipping, Adam on each rank's shard, the updated shards
   gathered back into the model's parameters. A non-finite grad norm skips the step, which
   is reported as ``actor/nonfinite_steps`` 1.0 (the trainer worker counts them).
"""

from __future__ import annotations

from typing import Any

import torch

from rl_train.engines.training.megatron.cpu_compat import megatron_on_this_device


def wrap_for_training(model: Any, config: Any, optimizer_settings: dict[str, Any]) -> tuple[Any, Any]:
    """(the DDP-wrapped model, its distributed optimizer). ``optimizer_settings``: ``lr``,
    ``weight_decay``, ``betas``, ``grad_clip`` and optionally ``eps``."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config.calculate_per_token_loss = True  # sum the gradients; divide once by the global denominator
    beta1, beta2 = optimizer_settings["betas"]
    with megatron_on_this_device():
        ddp = DistributedDataParallel(
            config,
            DistributedDataParallelConfig(
                use_distributed_optimizer=True, grad_reduce_in_fp32=True, overlap_grad_reduce=False
            ),
            model,
        )
        optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=float(optimizer_settings["lr"]),
                weight_decay=float(optimizer_settings["weight_decay"]),
                adam_beta1=float(beta1),
                adam_beta2=float(beta2),
                adam_eps=float(optimizer_settings.get("eps", 1e-8)),
                clip_grad=float(optimizer_settings["grad_clip"]),
                use_distributed_optimizer=True,
                params_dtype=config.params_dtype,
            ),
            [ddp],
        )
    return ddp, optimizer


def zero_grads(ddp: Any, optimizer: Any) -> None:
    with megatron_on_this_device():
        ddp.zero_grad_buffer()
        optimizer.zero_grad()


def optimizer_step(ddp: Any, optimizer: Any, local_denominator: float) -> dict[str, float]:
    """Reduce the gradients over data parallel, divide by the global denominator, step."""
    from megatron.core.distributed import finalize_model_grads

    with megatron_on_this_device():
        device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
        tokens = torch.tensor(float(local_denominator), dtype=torch.float32, device=device)
        finalize_model_grads([ddp], num_tokens=tokens)
        updated, grad_norm, _ = optimizer.step()
    norm = float(grad_norm) if grad_norm is not None else float("nan")
    return {"actor/grad_norm": norm, "actor/nonfinite_steps": 0.0 if updated else 1.0}
