"""The whole model out of its tensor-parallel shards, as HF-named tensors (R-4.6).

Every TP rank holds an equal slice of each parallel layer, so each parameter is gathered with
one ``all_gather`` of tensors over the TP group (no pickled objects cross the wire), then
``unshard_tensor_parallel`` puts the slices back together and ``megatron_to_hf`` renames,
splits the fused QKV and the gated MLP, and drops the vocabulary's padding. Every rank of the
group ends with the whole model; the trainer's rank 0 is the one that sends it on.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from rl_train.engines.training.megatron.hf_bridge import megatron_to_hf, unshard_tensor_parallel


def local_parameters(model: Any) -> dict[str, torch.Tensor]:
    """This rank's parameters by ``GPTModel`` name (a DDP wrapper's ``module.`` prefix dropped)."""
    return {name.removeprefix("module."): param.detach() for name, param in model.named_parameters()}


def gather_tensor_parallel(local: dict[str, torch.Tensor], hf_config: Any) -> dict[str, torch.Tensor]:
    """The whole ``GPTModel`` parameters from every TP rank's ``local`` ones (a collective: every
    rank of the TP group calls it)."""
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    size = parallel_state.get_tensor_model_parallel_world_size()
    if size == 1:
        return dict(local)
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(size)]
    for name in sorted(local):  # the same order on every rank
        tensor = local[name].contiguous()
        parts = [torch.empty_like(tensor) for _ in range(size)]
        dist.all_gather(parts, tensor, group=group)
        for shard, part in zip(shards, parts, strict=True):
            shard[name] = part
    return unshard_tensor_parallel(shards, hf_config)


def export_hf_weights(model: Any, hf_config: Any) -> dict[str, torch.Tensor]:
    """HF-named tensors of the whole model (a collective over the TP group)."""
    return megatron_to_hf(gather_tensor_parallel(local_parameters(model), hf_config), hf_config)
