"""The trainer side of distillation (R-4.10): teacher fields collated to ``[B, T]`` / ``[B, T, k]``,
the torch engine's ``student_topk_log_probs``, gradients independent of the micro-batch cut for
each distillation loss, and the update refusing a record without a teacher score."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.algorithms.teacher_fields import (
    STUDENT_TOPK_LOG_PROBS,
    TEACHER_LOG_PROBS,
    TEACHER_TOPK_IDS,
    TEACHER_TOPK_LOG_PROBS,
    TOPK_FIELDS,
)
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.torch_engine import TorchTrainingEngine
from rl_train.storage.records import collate, require_response_fields

K = 4
FIELDS = ["old_log_probs", "advantages", TEACHER_LOG_PROBS]


def _records(vocab: int, bos: int, count: int = 12, seed: int = 0) -> list[dict[str, Any]]:
    """Rows of three response lengths, interleaved (so sorting reorders them), with every
    teacher field; the teacher's top-k mass is below 1 and its ids are distinct per position."""
    rng = random.Random(seed)
    records = []
    for i in range(count):
        length = (3, 9, 5)[i % 3]
        response = [rng.randrange(4, vocab) for _ in range(length)]
        topk = [sorted((math.log(rng.uniform(0.02, 0.3)) for _ in range(K)), reverse=True) for _ in range(length)]
        records.append(
            {
                "prompt_ids": [bos, *(rng.randrange(4, vocab) for _ in range(2 + i % 2))],
                "response_ids": response,
                "old_log_probs": [rng.uniform(-4.0, -2.0) for _ in range(length)],
                "advantages": [((i % 5) - 2) / 2.0] * length,
                TEACHER_LOG_PROBS: [rng.uniform(-4.0, -1.0) for _ in range(length)],
                TEACHER_TOPK_IDS: [rng.sample(range(vocab), K) for _ in range(length)],
                TEACHER_TOPK_LOG_PROBS: topk,
            }
        )
    return records


def test_top_k_fields_are_collated_on_the_response_positions() -> None:
    records = [
        {"prompt_ids": [1, 2], "response_ids": [5, 6], TEACHER_TOPK_IDS: [[7, 8], [9, 10]],
         TEACHER_TOPK_LOG_PROBS: [[-0.5, -1.5], [-0.25, -2.0]]},
        {"prompt_ids": [1], "response_ids": [5, 6, 7], TEACHER_TOPK_IDS: [[1, 2], [3, 4], [5, 6]],
         TEACHER_TOPK_LOG_PROBS: [[-1.0, -2.0], [-3.0, -4.0], [-5.0, -6.0]]},
    ]  # fmt: skip
    batch = collate(records, 0, (), TOPK_FIELDS)
    ids, log_probs = batch[TEACHER_TOPK_IDS], batch[TEACHER_TOPK_LOG_PROBS]
    assert ids.dtype == torch.long and log_probs.dtype == torch.float32
    assert ids.shape == log_probs.shape == (2, 4, 2)
    assert ids[0].tolist() == [[0, 0], [0, 0], [7, 8], [9, 10]]
    assert ids[1].tolist() == [[0, 0], [1, 2], [3, 4], [5, 6]]
    assert log_probs[0, 2:].tolist() == [[-0.5, -1.5], [-0.25, -2.0]] and not log_probs[0, :2].any()
    # the fields sit where the response mask is 1
    assert ((ids != 0).any(-1).float() <= batch["response_mask"]).all()


def _base(graded: bool = True, **fields: Any) -> dict[str, Any]:
    record = {"prompt_ids": [1], "response_ids": [5, 6, 7], **fields}
    if not graded:
        record["response_mask"] = [0, 0, 0]
    return record


def test_the_update_check_refuses_a_graded_record_without_its_teacher_scores() -> None:
    good = _base(**{TEACHER_LOG_PROBS: [-1.0, -2.0, -3.0]})
    with pytest.raises(KeyError, match=r"record 'b' has graded response tokens but no 'teacher_log_probs'"):
        require_response_fields([good, _base()], ["a", "b"], [TEACHER_LOG_PROBS])
    with pytest.raises(ValueError, match=r"record 'b': 'teacher_log_probs' has 2 entries for its 3 response tokens"):
        require_response_fields([good, _base(**{TEACHER_LOG_PROBS: [-1.0, -2.0]})], ["a", "b"], [TEACHER_LOG_PROBS])
    topk = {TEACHER_TOPK_IDS: [[1, 2]] * 3, TEACHER_TOPK_LOG_PROBS: [[-1.0, -2.0]] * 3}
    with pytest.raises(KeyError, match="no 'teacher_topk_log_probs'"):
        require_response_fields([_base(**{TEACHER_TOPK_IDS: [[1, 2]] * 3})], ["a"], [], TOPK_FIELDS)
    with pytest.raises(ValueError, match=r"record 'b': 'teacher_topk_ids' has a row of 3 entries where the batch's have 2"):
        require_response_fields(
            [_base(**topk), _base(**{**topk, TEACHER_TOPK_IDS: [[1, 2, 3]] * 3})], ["a", "b"], [], TOPK_FIELDS
        )
    # a record with no graded token trains nothing: it may lack the scores, and gets zeros
    out = require_response_fields([_base(**topk), _base(graded=False)], ["a", "b"], [], TOPK_FIELDS)
    assert out[1][TEACHER_TOPK_IDS] == [[0, 0]] * 3 and out[0] is not out[1]
    out = require_response_fields([_base(graded=False)], ["a"], [TEACHER_LOG_PROBS], TOPK_FIELDS)
    assert out[0][TEACHER_LOG_PROBS] == [0.0] * 3 and out[0][TEACHER_TOPK_IDS] == [[]] * 3


@pytest.fixture(scope="module")
def engine(tiny_model_dir) -> TorchTrainingEngine:
    return TorchTrainingEngine(tiny_model_dir, ActorConfig(), 10, temperature=0.8)


def _vocab(engine: TorchTrainingEngine) -> int:
    return int(engine.model.config.vocab_size)


def test_student_top_k_log_probs_are_the_full_softmax_at_the_ids_aligned_with_log_probs(engine) -> None:
    records = _records(_vocab(engine), engine.tokenizer.bos_token_id)
    batch = collate(records, int(engine.tokenizer.pad_token_id), FIELDS, TOPK_FIELDS)
    with torch.no_grad():
        out = engine._forward(batch, with_entropy=False)
        logits = engine.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert out[STUDENT_TOPK_LOG_PROBS].shape == batch[TEACHER_TOPK_IDS].shape
    full = torch.log_softmax(logits.double() / 0.8, dim=-1)
    mask = batch["response_mask"]
    for i in range(len(records)):
        for t in range(batch["input_ids"].shape[1]):
            if mask[i, t]:  # position t holds the distribution that produced token t: logits at t - 1
                want = full[i, t - 1, batch[TEACHER_TOPK_IDS][i, t]]
                torch.testing.assert_close(out[STUDENT_TOPK_LOG_PROBS][i, t].double(), want, atol=2e-5, rtol=0)
    # k = 1 at the sampled token's own id is the token's log-prob
    batch[TEACHER_TOPK_IDS] = batch["input_ids"].unsqueeze(-1)
    with torch.no_grad():
        out = engine._forward(batch, with_entropy=False)
    real = batch["attention_mask"].bool()
    real[:, 0] = False
    torch.testing.assert_close(out[STUDENT_TOPK_LOG_PROBS][..., 0][real], out["log_probs"][real], atol=0, rtol=0)


def _grads(engine: TorchTrainingEngine, batch, cfg: ActorConfig) -> tuple[dict[str, torch.Tensor], dict]:
    engine.cfg = cfg
    engine.optimizer.zero_grad(set_to_none=True)
    metrics = engine.forward_backward_batch(batch, build_actor_loss_fn(cfg), forward_only=False)
    return {n: p.grad.clone() for n, p in engine.model.named_parameters() if p.grad is not None}, metrics


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize(
    ("loss", "term"),
    [("reverse_kl", "reverse_kl"), ("forward_kl_topk", "reverse_kl"), ("distillation_ppo", "forward_kl_topk")],
)
def test_distillation_gradients_do_not_depend_on_the_micro_batch_cut(engine, loss: str, term: str, mode: str) -> None:
    records = _records(_vocab(engine), engine.tokenizer.bos_token_id)
    batch = collate(records, int(engine.tokenizer.pad_token_id), FIELDS, TOPK_FIELDS)
    common = {"policy_loss": loss, "distill_term": term, "loss_agg_mode": mode, "distill_coef": 0.5}
    whole_grads, whole = _grads(engine, batch, ActorConfig(**common))
    assert any(g.abs().max() > 0 for g in whole_grads.values())
    assert whole["actor/num_micro_batches"] == 1
    metric = "distill/forward_kl_topk" if "forward_kl_topk" in (loss, term) else "distill/reverse_kl"
    for cut in (ActorConfig(**common, micro_batch_size=5), ActorConfig(**common, micro_batch_size=4, sort_by_length=True)):
        grads, metrics = _grads(engine, batch, cut)
        assert metrics["actor/num_micro_batches"] > 1
        assert metrics["actor/loss"] == pytest.approx(whole["actor/loss"], rel=1e-5, abs=1e-7)
        assert metrics[metric] == pytest.approx(whole[metric], rel=1e-5)
        for name, grad in whole_grads.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6)


class _FakeQueue:
    """The TransferQueue's ``get`` over in-process records (``ray.get`` is the identity here)."""

    def __init__(self, records: dict[str, dict[str, Any]]) -> None:
        self.records = records
        self.get = SimpleNamespace(remote=lambda partition, keys, fields=None: [self.records[k] for k in keys])


@pytest.fixture
def worker_factory(tiny_model_dir, monkeypatch):
    """A ``TrainerWorker`` in this process over a ``_FakeQueue`` (no Ray: ``ray.get`` passes the
    records through; the host-memory tweaks of a worker process are left out)."""
    from rl_train.engines.workers import trainer_worker

    monkeypatch.setattr(trainer_worker, "ray", SimpleNamespace(get=lambda value: value))
    monkeypatch.setattr(trainer_worker, "keep_freed_memory", lambda: None)
    monkeypatch.setattr(trainer_worker, "freeze_built_objects", lambda: None)
    threads = torch.get_num_threads()

    def build(records: dict[str, dict[str, Any]], **actor: Any) -> trainer_worker.TrainerWorker:
        cfg = ActorConfig(num_threads=threads, **actor).model_dump()
        return trainer_worker.TrainerWorker(0, 1, str(tiny_model_dir), cfg, 10, 1.0, 0, _FakeQueue(records))

    yield build
    torch.set_num_threads(threads)


@pytest.mark.parametrize(("loss", "field"), [("forward_kl_topk", TEACHER_TOPK_LOG_PROBS), ("reverse_kl", TEACHER_LOG_PROBS)])
def test_the_update_refuses_a_record_without_a_teacher_score_and_trains_with_them(
    worker_factory, engine, loss: str, field: str
) -> None:
    records = {f"r{i}": r for i, r in enumerate(_records(_vocab(engine), engine.tokenizer.bos_token_id, count=6))}
    del records["r2"]["advantages"]  # a distillation-only loss never asks for the task's advantages
    worker = worker_factory(records, policy_loss=loss)
    keys = sorted(records)
    metrics = worker.update("train", keys, num_mini_batches=2)
    assert math.isfinite(metrics["actor/loss"]) and metrics["actor/grad_norm"] > 0
    scored = records["r3"]
    worker.tq.records["r3"] = {key: value for key, value in scored.items() if key != field}
    with pytest.raises(KeyError, match=f"record 'r3' has graded response tokens but no '{field}'"):
        worker.update("train", keys, num_mini_batches=1)
    worker.tq.records["r3"] = {**scored, field: scored[field][:-1]}
    with pytest.raises(ValueError, match=f"record 'r3': '{field}' has"):
        worker.update("train", keys, num_mini_batches=1)


def test_a_sharded_ranks_filler_micro_batch_carries_the_top_k_fields_and_adds_nothing(monkeypatch) -> None:
    """A rank with fewer micro-batches than another runs fillers (``_matched``): one padded row
    each, with every field, the ``[B, T, k]`` ones included, whose loss is 0 under every
    distillation loss. (The other rank's count, 1, stands in for the all-reduce.)"""
    from rl_train.engines.training import torch_engine

    def other_rank_has_one(count: torch.Tensor, op: object) -> None:
        count.fill_(1)

    monkeypatch.setattr(torch_engine, "dist", SimpleNamespace(all_reduce=other_rank_has_one, ReduceOp=torch_engine.dist.ReduceOp))
    batch = collate(_records(40, 1, count=2), 0, FIELDS, TOPK_FIELDS)
    fake = SimpleNamespace(sharded=True, device=torch.device("cpu"), tokenizer=SimpleNamespace(pad_token_id=0))
    passes = TorchTrainingEngine._matched(fake, [], batch)  # type: ignore[arg-type]
    assert len(passes) == 1
    filler = passes[0]
    assert filler[TEACHER_TOPK_IDS].shape == (1, 1, K) and filler[TEACHER_TOPK_IDS].dtype == torch.long
    assert filler[TEACHER_TOPK_LOG_PROBS].shape == (1, 1, K) and not filler["response_mask"].any()
    outputs = {"log_probs": torch.zeros(1, 1), STUDENT_TOPK_LOG_PROBS: torch.zeros(1, 1, K)}
    for loss, term in (("forward_kl_topk", "reverse_kl"), ("reverse_kl", "reverse_kl"), ("distillation_ppo", "forward_kl_topk")):
        numerator, denominator, _ = build_actor_loss_fn(ActorConfig(policy_loss=loss, distill_term=term))(outputs, filler)
        assert float(numerator) == 0.0 and denominator == 0.0
