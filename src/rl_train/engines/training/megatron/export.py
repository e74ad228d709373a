"""The whole model out of its tensor-parallel shards and pipeline stages, as HF-named tensors (R-4.6).

- **Tensor parallel.** Every TP rank holds an equal slice of each parallel layer, so each
  parameter is gathered with one ``all_gather`` of tensors over the TP group, and
  ``unshard_tensor_parallel`` puts the slices back together.
- **Pipeline parallel.** Stages hold different layers. Each stage in turn broadcasts the
  names, shapes and dtypes of its parameters (JSON in a byte tensor), then the tensors
  themselves, over the pipeline group; ``merge_pipeline_stages`` numbers the layers globally.

No pickled object crosses the wire. ``megatron_to_hf`` then renames, splits the fused QKV and
the gated MLP, and drops the vocabulary's padding. Every rank ends with the whole model; the
trainer's rank 0 is the one that sends it on.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from rl_train.engines.training.megatron.hf_bridge import (
    megatron_to_hf,
    merge_pipeline_stages,
    unshard_tensor_parallel,
)


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


def comm_device() -> torch.device:
    """Where tensors for a collective must be: CUDA under NCCL, the host under gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_json(document: Any, src: int, group: Any) -> Any:
    """``document`` from global rank ``src`` to every rank of ``group``, as UTF-8 JSON bytes."""
    device = comm_device()
    if dist.get_rank() == src:
        data = torch.frombuffer(bytearray(json.dumps(document).encode()), dtype=torch.uint8).to(device)
        length = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    else:
        length = torch.zeros(1, dtype=torch.int64, device=device)
    dist.broadcast(length, src=src, group=group)
    if dist.get_rank() != src:
        data = torch.empty(int(length[0]), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=src, group=group)
    return json.loads(bytes(data.cpu().tolist()).decode())


def gather_pipeline_stages(stage_state: dict[str, torch.Tensor], hf_config: Any) -> dict[str, torch.Tensor]:
    """The whole ``GPTModel`` parameters from every pipeline stage's (whole across TP) ones, on
    every stage (a collective over the pipeline group)."""
    from megatron.core import parallel_state

    group = parallel_state.get_pipeline_model_parallel_group()
    ranks = dist.get_process_group_ranks(group)
    if len(ranks) == 1:
        return dict(stage_state)
    stages = []
    for src in ranks:
        mine = dist.get_rank() == src
        layout = {n: [list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in stage_state.items()}
        layout = broadcast_json(layout if mine else None, src, group)
        tensors = {}
        for name in sorted(layout):
            shape, dtype = layout[name]
            tensor = (
                stage_state[name].contiguous()
                if mine
                else torch.empty(shape, dtype=getattr(torch, dtype), device=comm_device())
            )
            dist.broadcast(tensor, src=src, group=group)
            tensors[name] = tensor
        stages.append(tensors)
    return merge_pipeline_stages(stages, hf_config)


def export_hf_weights(model: Any, hf_config: Any) -> dict[str, torch.Tensor]:
    """HF-named tensors of the whole model (a collective over the TP and pipeline groups)."""
    whole_stage = gather_tensor_parallel(local_parameters(model), hf_config)
    return megatron_to_hf(gather_pipeline_stages(whole_stage, hf_config), hf_config)
