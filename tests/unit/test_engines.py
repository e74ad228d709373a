"""Rollout and training engines: agreement of log-probs, split-independent gradients, lifecycle."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.engines.rollout.protocol import GenerationRequest, RolloutEngine, SamplingParams
from rl_train.engines.rollout.torch_engine import EngineStateError, TorchRolloutEngine
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.protocol import TrainingEngine
from rl_train.engines.training.torch_engine import TorchTrainingEngine
from rl_train.storage.records import collate, scatter_response


def _requests(engine: TorchRolloutEngine, count: int) -> list[GenerationRequest]:
    prompts = [f"{i % 10}+{(3 * i) % 10}=" if i % 3 else f"{i}+{i * 7}=" for i in range(count)]
    return [
        GenerationRequest(
            str(i), [engine.tokenizer.bos_token_id, *engine.tokenizer.encode(p, add_special_tokens=False)]
        )
        for i, p in enumerate(prompts)
    ]


def _records(results, advantages: bool = False) -> list[dict]:
    out = []
    for i, r in enumerate(results):
        rec = {"prompt_ids": r.prompt_ids, "response_ids": r.response_ids, "old_log_probs": r.log_probs}
        if advantages:
            rec["advantages"] = [((i % 5) - 2) / 2.0] * len(r.response_ids)
        out.append(rec)
    return out


def test_engines_conform_to_their_protocols(tiny_model_dir) -> None:
    assert isinstance(TorchRolloutEngine(tiny_model_dir), RolloutEngine)
    assert isinstance(TorchTrainingEngine(tiny_model_dir, ActorConfig(), 10), TrainingEngine)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_log_probs_match_training_log_probs(tiny_model_dir, temperature: float) -> None:
    """Prompts of different lengths (left-padded in rollout, right-padded in training)."""
    rollout = TorchRolloutEngine(tiny_model_dir, seed=3)
    trainer = TorchTrainingEngine(tiny_model_dir, ActorConfig(), 10, temperature=temperature)
    results = rollout.generate(_requests(rollout, 48), SamplingParams(temperature, 0.9, 6))
    records = _records(results)
    recomputed = scatter_response(trainer.compute_log_probs(collate(records, 0))["log_probs"], records)
    total = 0
    for result, again in zip(results, recomputed, strict=True):
        assert len(result.log_probs) == len(again) > 0
        torch.testing.assert_close(torch.tensor(again), torch.tensor(result.log_probs), atol=1e-5, rtol=0)
        total += len(again)
    assert total > 48


def _grads(engine: TorchTrainingEngine, batch, cfg: ActorConfig) -> tuple[dict[str, torch.Tensor], float]:
    engine.optimizer.zero_grad(set_to_none=True)
    metrics = engine.forward_backward_batch(batch, build_actor_loss_fn(cfg), forward_only=False)
    return {n: p.grad.clone() for n, p in engine.model.named_parameters() if p.grad is not None}, metrics[
        "actor/loss"
    ]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_gradients_do_not_depend_on_the_micro_batch_split(tiny_model_dir, mode: str) -> None:
    rollout = TorchRolloutEngine(tiny_model_dir, seed=1)
    records = _records(rollout.generate(_requests(rollout, 24), SamplingParams(1.0, 1.0, 6)), advantages=True)
    for rec in records:  # a policy a little away from pi_old so the ratio is not exactly 1
        rec["old_log_probs"] = [x - 0.05 for x in rec["old_log_probs"]]
    batch = collate(records, 0, ["old_log_probs", "advantages"])
    whole = ActorConfig(loss_agg_mode=mode)
    split = ActorConfig(loss_agg_mode=mode, micro_batch_size=6)
    grads_1, loss_1 = _grads(TorchTrainingEngine(tiny_model_dir, whole, 10), batch, whole)
    engine_4 = TorchTrainingEngine(tiny_model_dir, split, 10)
    grads_4, loss_4 = _grads(engine_4, batch, split)
    assert (
        engine_4.forward_backward_batch(batch, build_actor_loss_fn(split), False)["actor/num_micro_batches"]
        == 4
    )
    assert loss_1 == pytest.approx(loss_4, abs=1e-6)
    assert any(g.abs().max() > 0 for g in grads_1.values())
    for name, grad in grads_1.items():
        torch.testing.assert_close(grads_4[name], grad, atol=1e-6, rtol=1e-5)


def test_token_budget_micro_batches(tiny_model_dir) -> None:
    rollout = TorchRolloutEngine(tiny_model_dir, seed=1)
    records = _records(rollout.generate(_requests(rollout, 16), SamplingParams(1.0, 1.0, 6)), advantages=True)
    batch = collate(records, 0, ["old_log_probs", "advantages"])
    cfg = ActorConfig(max_tokens_per_micro_batch=40)
    engine = TorchTrainingEngine(tiny_model_dir, cfg, 10)
    metrics = engine.forward_backward_batch(batch, build_actor_loss_fn(cfg), False)
    widest = int(batch["attention_mask"].sum(-1).max())
    assert metrics["actor/num_micro_batches"] >= (16 * widest) // 40 // 2


def test_training_step_changes_weights_and_export_uses_hf_names(tiny_model_dir) -> None:
    cfg = ActorConfig(lr=1e-2)
    engine = TorchTrainingEngine(tiny_model_dir, cfg, 10)
    rollout = TorchRolloutEngine(tiny_model_dir)
    records = _records(rollout.generate(_requests(rollout, 8), SamplingParams(1.0, 1.0, 4)), advantages=True)
    before = {k: v.clone() for k, v in engine.export_weights()}
    metrics = engine.train_batch(
        collate(records, 0, ["old_log_probs", "advantages"]), build_actor_loss_fn(cfg)
    )
    after = dict(engine.export_weights())
    assert set(before) == set(rollout.model.state_dict())
    assert metrics["actor/grad_norm"] > 0
    assert any(not torch.equal(before[k], after[k]) for k in before)
    rollout.update_weights(after.items(), version=7)
    assert rollout.version == 7
    for name, tensor in rollout.model.state_dict().items():
        torch.testing.assert_close(tensor, after[name])


def test_rollout_results_carry_versions_and_stop_reasons(tiny_model_dir) -> None:
    engine = TorchRolloutEngine(tiny_model_dir)
    engine.version = 4
    results = engine.generate(_requests(engine, 8), SamplingParams(1.0, 1.0, 2))
    for r in results:
        assert r.token_versions == [4] * len(r.response_ids)
        assert r.stop_reason in ("eos", "length")
        assert len(r.response_ids) <= 2
        if r.stop_reason == "eos":
            assert r.response_ids[-1] == engine.eos_token_id


def test_abort_returns_partial_results_without_crashing(tiny_model_dir) -> None:
    engine = TorchRolloutEngine(tiny_model_dir)
    engine.eos_token_id = -1  # never stop on EOS: the request runs until aborted or out of budget
    out: list = []
    worker = threading.Thread(
        target=lambda: out.extend(engine.generate(_requests(engine, 4), SamplingParams(1.0, 1.0, 200)))
    )
    worker.start()
    deadline = time.time() + 20
    while engine._in_flight == 0 and time.time() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)
    assert engine.abort() == 4
    worker.join(timeout=20)
    assert [r.stop_reason for r in out] == ["aborted"] * 4
    assert all(0 < len(r.response_ids) < 200 and len(r.log_probs) == len(r.response_ids) for r in out)


def test_sleep_frees_weights_and_wake_restores_them(tiny_model_dir) -> None:
    engine = TorchRolloutEngine(tiny_model_dir)
    params = SamplingParams(0.0, 1.0, 4)
    reference = engine.generate(_requests(engine, 6), params)
    engine.sleep()
    assert all(p.numel() == 0 for p in engine.model.parameters())
    with pytest.raises(EngineStateError, match="asleep"):
        engine.generate(_requests(engine, 1), params)
    engine.wake_up()
    again = engine.generate(_requests(engine, 6), params)
    assert [r.response_ids for r in again] == [r.response_ids for r in reference]


def test_weights_pushed_while_asleep_are_served_after_wake(tiny_model_dir) -> None:
    engine = TorchRolloutEngine(tiny_model_dir)
    donor = TorchTrainingEngine(tiny_model_dir, ActorConfig(), 10)
    with torch.no_grad():
        for p in donor.model.parameters():
            p.add_(0.01)
    engine.sleep()
    engine.update_weights(donor.export_weights(), version=2)
    engine.wake_up()
    for name, tensor in donor.model.state_dict().items():
        torch.testing.assert_close(engine.model.state_dict()[name], tensor)
    assert engine.version == 2


@pytest.mark.parametrize("asleep", [False, True])
def test_sparse_updates_overwrite_only_the_given_entries(tiny_model_dir, asleep: bool) -> None:
    engine = TorchRolloutEngine(tiny_model_dir)
    before = {name: t.detach().clone() for name, t in engine.model.state_dict().items()}
    name = next(iter(before))
    index = torch.tensor([0, 3, before[name].numel() - 1], dtype=torch.int32)
    values = torch.tensor([1.5, -2.0, 7.0], dtype=before[name].dtype)
    if asleep:
        engine.sleep()
    engine.update_weights_sparse([(name, index, values)], version=5)
    if asleep:
        engine.wake_up()
    after = engine.model.state_dict()
    expected = before[name].clone()
    expected.view(-1)[index.long()] = values
    assert torch.equal(after[name], expected)
    untouched = [other for other in before if after[other].data_ptr() != after[name].data_ptr()]  # not tied
    assert untouched and all(torch.equal(after[other], before[other]) for other in untouched)
    assert engine.version == 5
    if not asleep:
        with pytest.raises(KeyError, match="update_weights_sparse: .* no tensor named 'nope'"):
            engine.update_weights_sparse([("nope", index, values)], version=6)
