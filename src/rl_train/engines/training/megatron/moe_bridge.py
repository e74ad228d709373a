"""Mixture-of-experts layers between HF (``mixtral``) and megatron-core, and router replay (R-4.8).

**Layout.** transformers 5 keeps a Mixtral layer's experts fused: ``mlp.gate.weight`` [E, H]
(the router), ``mlp.experts.gate_up_proj`` [E, 2I, H] (each expert's gate rows, then its up
rows) and ``mlp.experts.down_proj`` [E, H, I]. megatron-core's local spec holds the router as
``mlp.router.weight`` and each expert as a gated MLP of its own,
``mlp.experts.local_experts.<e>.linear_fc1.weight`` ([gate; up]) and ``linear_fc2.weight``.

**Routing.** Mixtral takes the softmax over all experts, keeps the top k and renormalises them;
megatron takes the top k of the logits and a softmax over those: the same weights. Dropless
(no capacity), no load-balancing loss, the all-gather dispatcher.

**Router replay.** megatron-core's routers can record the top-k experts each token went to and
replay given ones instead of choosing (``RouterReplay``). R2 records the routes of the
old_log_prob pass and replays them in the update, so that the update's ratio compares the
same experts (``start_recording`` / ``set_replay``). Routes are per token: ``[B, T, L, k]``
(batch row, position, MoE layer, choice), and megatron's own order per layer is position-major
over the micro-batch (``[T * B, k]``).
"""

from __future__ import annotations

from typing import Any

import torch

MOE_MODEL_TYPES = ("mixtral",)


def _get(hf_config: Any, key: str, default: Any = None) -> Any:
    return hf_config.get(key, default) if isinstance(hf_config, dict) else getattr(hf_config, key, default)


def is_moe(hf_config: Any) -> bool:
    return bool(_get(hf_config, "num_local_experts"))


def moe_config_fields(hf_config: Any) -> dict[str, Any]:
    """The ``TransformerConfig`` fields of an MoE model ({} for a dense one)."""
    if not is_moe(hf_config):
        return {}
    return {
        "num_moe_experts": int(_get(hf_config, "num_local_experts")),
        "moe_router_topk": int(_get(hf_config, "num_experts_per_tok")),
        "moe_ffn_hidden_size": int(_get(hf_config, "intermediate_size")),
        "moe_token_dispatcher_type": "allgather",
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_enable_routing_replay": True,
    }


def define_missing_te_gemm() -> None:
    """megatron-core 0.16's router names Transformer Engine's gemm (``te_general_gemm``) without
    defining it when Transformer Engine is not installed; it then takes its plain path."""
    import megatron.core.transformer.moe.moe_utils as moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _expert(layer: int, index: int, part: str) -> str:
    return f"decoder.layers.{layer}.mlp.experts.local_experts.{index}.{part}.weight"


def moe_to_megatron(hf_state: dict[str, torch.Tensor], hf_config: Any, layer: int) -> dict[str, torch.Tensor]:
    """One layer's router and experts, from either HF layout: the fused one of a model in memory
    (and of the weights a training engine exports), or the per-expert one transformers writes
    to disk (``block_sparse_moe.experts.<e>.w1`` gate, ``w3`` up, ``w2`` down)."""
    prefix = f"model.layers.{layer}.mlp."
    if prefix + "gate.weight" in hf_state:
        out = {f"decoder.layers.{layer}.mlp.router.weight": hf_state[prefix + "gate.weight"]}
        gate_up, down = hf_state[prefix + "experts.gate_up_proj"], hf_state[prefix + "experts.down_proj"]
        for index in range(gate_up.shape[0]):
            out[_expert(layer, index, "linear_fc1")] = gate_up[index]
            out[_expert(layer, index, "linear_fc2")] = down[index]
        return out
    legacy = f"model.layers.{layer}.block_sparse_moe."
    out = {f"decoder.layers.{layer}.mlp.router.weight": hf_state[legacy + "gate.weight"]}
    for index in range(int(_get(hf_config, "num_local_experts"))):
        expert = f"{legacy}experts.{index}."
        out[_expert(layer, index, "linear_fc1")] = torch.cat([hf_state[expert + "w1.weight"], hf_state[expert + "w3.weight"]])
        out[_expert(layer, index, "linear_fc2")] = hf_state[expert + "w2.weight"]
    return out


def moe_to_hf(state: dict[str, torch.Tensor], hf_config: Any, layer: int) -> dict[str, torch.Tensor]:
    experts = range(int(_get(hf_config, "num_local_experts")))
    prefix = f"model.layers.{layer}.mlp."
    return {
        prefix + "gate.weight": state[f"decoder.layers.{layer}.mlp.router.weight"],
        prefix + "experts.gate_up_proj": torch.stack([state[_expert(layer, e, "linear_fc1")] for e in experts]),
        prefix + "experts.down_proj": torch.stack([state[_expert(layer, e, "linear_fc2")] for e in experts]),
    }


def routers(model: Any) -> list[Any]:
    """The ``RouterReplay`` of each MoE layer of ``model``, in layer order (this model's own:
    a process may hold several models, each with its routers)."""
    from megatron.core.transformer.moe.router import TopKRouter

    return [module.router_replay for module in model.modules() if isinstance(module, TopKRouter)]


def start_recording(model: Any) -> None:
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    for replay in routers(model):
        replay.clear_indices()
        replay.set_router_replay_action(RouterReplayAction.RECORD)


def recorded_routes(model: Any, rows: int, width: int) -> torch.Tensor:
    """The routes the last forward recorded, ``[rows, width, L, k]`` (``[rows, width, 0, 0]``
    for a dense model)."""
    per_layer = [replay.get_recorded_indices() for replay in routers(model)]
    if not per_layer:
        return torch.zeros((rows, width, 0, 0), dtype=torch.long)
    stacked = torch.stack([indices.reshape(width, rows, -1) for indices in per_layer], dim=2)  # [T, B, L, k]
    return stacked.permute(1, 0, 2, 3).contiguous()


def set_replay(model: Any, routes: torch.Tensor) -> None:
    """Make the next forward send each token to the experts ``routes`` [B, T, L, k] gives."""
    from megatron.core.transformer.moe.router_replay import RouterReplayAction

    by_layer = routes.permute(2, 1, 0, 3)  # [L, T, B, k]
    for layer, replay in enumerate(routers(model)):
        replay.clear_indices()
        replay.set_target_indices(by_layer[layer].reshape(-1, routes.shape[-1]).long())
        replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)


def stop_routing_control(model: Any) -> None:
    """Back to routing by the router's own scores; nothing recorded or targeted is kept."""
    for replay in routers(model):
        replay.clear_router_replay_action()
        replay.clear_indices()
