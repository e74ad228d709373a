"""An MoE policy on the megatron engine (a tiny Mixtral, in-process, a gloo world of one), and
router replay (R-4.8, R2): the routes a pass records route a later pass exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import megatron.core  # noqa: F401  (without a working megatron-core these tests fail, never skip)
import torch
from moe_fixture import EXPERTS, LAYERS, TOP_K

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.registry import build_training_engine
from rl_train.storage.records import collate


def _records() -> list[dict[str, Any]]:
    generator = torch.Generator().manual_seed(4)
    return [
        {
            "prompt_ids": [1, *torch.randint(3, 91, (3 + i % 3,), generator=generator).tolist()],
            "response_ids": torch.randint(3, 91, (4 + i,), generator=generator).tolist(),
            "old_log_probs": [-2.0] * (4 + i),
            "advantages": [1.0 if i % 2 else -1.0] * (4 + i),
        }
        for i in range(6)
    ]


def _batch() -> dict[str, torch.Tensor]:
    return collate(_records(), 0, ["old_log_probs", "advantages"])


def test_an_moe_policy_gives_the_hf_log_probs_and_exports_the_hf_weights(tiny_moe_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    engine = build_training_engine("megatron", tiny_moe_dir, ActorConfig(engine="megatron"), 10, 1.0, 0)
    reference = AutoModelForCausalLM.from_pretrained(tiny_moe_dir).eval()
    batch = _batch()
    mask = batch["attention_mask"]
    with torch.no_grad():
        logits = reference(input_ids=batch["input_ids"], attention_mask=mask).logits
    want = torch.nn.functional.pad(
        torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1), (1, 0)
    )
    got = engine.compute_log_probs(batch)["log_probs"]
    assert ((got - want).abs() * mask).max() < 1e-5
    exported, state = dict(engine.export_weights()), reference.state_dict()
    assert set(exported) == set(state) and all(torch.equal(exported[n], state[n]) for n in state)


def test_recorded_routes_route_a_later_pass_exactly(tiny_moe_dir: Path) -> None:
    engine = build_training_engine("megatron", tiny_moe_dir, ActorConfig(engine="megatron", lr=1e-3), 10, 1.0, 0)
    batch = _batch()
    real = batch["attention_mask"].bool()
    first = engine.compute_log_probs(batch, record_routes=True)
    routes = first["routes"]
    assert routes.shape == (*batch["input_ids"].shape, LAYERS, TOP_K)
    assert routes[real].min() >= 0 and routes[real].max() < EXPERTS
    assert (routes[real][..., 0] != routes[real][..., 1]).all()  # k distinct experts per token
    replayed = engine.compute_log_probs({**batch, "routes": routes})["log_probs"]
    assert torch.equal(replayed, first["log_probs"])  # replaying a pass's own routes changes nothing

    with torch.no_grad():  # the routers move (as an update moves them): fresh routing changes
        for layer in engine.module.decoder.layers:
            layer.mlp.router.weight.add_(torch.randn_like(layer.mlp.router.weight) * 3)
    fresh = engine.compute_log_probs(batch, record_routes=True)
    assert (fresh["routes"][real] != routes[real]).any()
    assert torch.equal(engine.compute_log_probs({**batch, "routes": fresh["routes"]})["log_probs"], fresh["log_probs"])
    old_routes = engine.compute_log_probs({**batch, "routes": routes})["log_probs"]
    assert not torch.equal(old_routes[real], fresh["log_probs"][real])  # the recorded experts, not today's

    loss_fn = build_actor_loss_fn(ActorConfig())
    with_replay = engine.train_batch({**batch, "routes": routes}, loss_fn)
    assert torch.isfinite(torch.tensor(with_replay["actor/loss"]))


def test_routes_captured_by_rollout_give_the_rollout_log_probs_in_training(tiny_moe_dir: Path) -> None:
    """R3: the built-in rollout engine keeps each token's experts (prompt and response); the
    training engine routed by them scores the sampled tokens as rollout did."""
    from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams
    from rl_train.engines.rollout.torch_engine import TorchRolloutEngine
    from rl_train.engines.training.router_replay import collate_routes
    from rl_train.storage.records import scatter_response

    rollout = TorchRolloutEngine(tiny_moe_dir, seed=0)
    requests = [GenerationRequest(str(i), [1, *range(5, 7 + i % 3)]) for i in range(6)]
    results = rollout.generate(requests, SamplingParams(1.0, 1.0, 6, return_routes=True))
    records = [{"prompt_ids": r.prompt_ids, "response_ids": r.response_ids, "routes": r.routes} for r in results]
    for record in records:
        assert len(record["routes"]) == len(record["prompt_ids"]) + len(record["response_ids"])
        assert all(len(layer) == TOP_K for token in record["routes"] for layer in token)
    assert rollout.generate(requests[:1], SamplingParams(1.0, 1.0, 2))[0].routes is None  # only when asked

    engine = build_training_engine("megatron", tiny_moe_dir, ActorConfig(engine="megatron"), 10, 1.0, 0)
    batch = collate(records, 0)
    batch["routes"] = collate_routes(records, batch["input_ids"].shape[1])
    replayed = scatter_response(engine.compute_log_probs(batch)["log_probs"], records)
    for result, log_probs in zip(results, replayed, strict=True):
        torch.testing.assert_close(torch.tensor(log_probs), torch.tensor(result.log_probs), atol=1e-5, rtol=0)


def test_r2_routes_written_by_old_log_prob_route_the_update(tiny_moe_dir: Path) -> None:
    """The strategy end to end: r2's old_log_prob pass writes each trajectory its experts; the
    update's mini-batch, collated from the stored records, carries them back exactly (a pass
    routed by them scores as pi_old's did, bit for bit), and once the routers have moved, the
    update still routes by pi_old's experts rather than today's."""
    from rl_train.engines.training.router_replay import REPLAYED_TOKENS_METRIC, build_router_replay

    engine = build_training_engine("megatron", tiny_moe_dir, ActorConfig(engine="megatron"), 10, 1.0, 0)
    replay = build_router_replay("r2", engine, "megatron")
    rows = _records()
    old, written = replay.old_log_probs(engine, collate(rows, 0), rows)
    stored = [{**r, **w} for r, w in zip(rows, written, strict=True)]
    assert [len(s["routes"]) for s in stored] == [len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows]
    update = collate(stored, 0, ["old_log_probs", "advantages"])
    replay.check_update_records(stored)
    replay.route_update(update, stored)
    real = update["attention_mask"].bool()  # (padding is routed to experts 0..k-1 now: its outputs feed nothing)
    assert torch.equal(engine.compute_log_probs(update)["log_probs"][real], old[real])
    with torch.no_grad():  # as an update moves them
        for layer in engine.module.decoder.layers:
            layer.mlp.router.weight.add_(torch.randn_like(layer.mlp.router.weight) * 3)
    fresh = engine.compute_log_probs(collate(rows, 0), record_routes=True)
    assert (fresh["routes"][real] != update["routes"][real]).any()
    replayed = engine.compute_log_probs(update)["log_probs"]
    assert not torch.equal(replayed[real], fresh["log_probs"][real])
    metrics = engine.train_batch(update, build_actor_loss_fn(ActorConfig()))
    assert torch.isfinite(torch.tensor(metrics["actor/loss"]))
    tokens = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows)
    assert replay.update_metrics([update], 2) == {REPLAYED_TOKENS_METRIC: 2.0 * tokens}
