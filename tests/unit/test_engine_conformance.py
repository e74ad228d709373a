"""Behaviour every registered engine must show: the Protocols' contract, checked per name.

Each test is parametrized over ``ROLLOUT_ENGINES`` / ``TRAINING_ENGINES`` (or their product),
so an engine is held to this suite by registering it. Only Protocol members are used here;
engine internals are tested in test_engines.py.
"""

from __future__ import annotations

import gc
import importlib.util
import itertools
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
import torch

from rl_train.algorithms.actor_loss import build_actor_loss_fn
from rl_train.engines.rollout.protocol import (
    EngineStateError,
    GenerationRequest,
    GenerationResult,
    RolloutEngine,
    SamplingParams,
    SparseWeightUpdates,
)
from rl_train.engines.rollout.registry import ROLLOUT_ENGINES, build_rollout_engine
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.protocol import TrainingEngine
from rl_train.engines.training.registry import TRAINING_ENGINES, build_training_engine
from rl_train.storage.records import collate, scatter_response

NEEDS = {"megatron": "megatron.core"}
"""Engines whose backend is an optional extra: their cases are skipped, visibly, without it."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _params(*names: str) -> Any:
    missing = [NEEDS[n] for n in names if n in NEEDS and not _installed(NEEDS[n])]
    marks = [pytest.mark.skip(reason=f"{', '.join(missing)} is not installed")] if missing else []
    return pytest.param(*names, marks=marks)


ROLLOUT = ROLLOUT_ENGINES.names()
TRAINING = [_params(name) for name in TRAINING_ENGINES.names()]
PAIRS = [_params(t, r) for t, r in itertools.product(TRAINING_ENGINES.names(), ROLLOUT)]
LONG = 240
"""A response budget far past what the tests wait for (the tiny policy has 256 positions)."""
SLACK_BYTES = 64 << 10
"""Host memory an idle engine may hold besides its weights (tokenizer tables, rotary buffers)."""


def live_tensor_bytes(device_type: str) -> int:
    """Bytes of the distinct tensor storages alive in this process on ``device_type``.

    Every ``torch.Tensor`` is an object the garbage collector tracks, so this finds what is
    really held (module parameters, a KV cache in a decoding thread's locals, a host copy in
    a dict) whatever an engine reports about itself; views of one storage count once.
    """
    gc.collect()
    storages: dict[int, int] = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor) and obj.device.type == device_type and obj.layout == torch.strided:
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


REMOTE = {"sglang"}
"""Engines whose model lives in a server process: its memory is not this process's to measure
(the server's own checks are the gpu-marked tests), and generation is seen starting by asking
the server (``running_requests``) rather than by the KV cache appearing here."""
OPTIONS: dict[str, dict] = {}
"""Each engine's own config section for this test (the sglang one attaches to the CPU server)."""
_BUILT: list[RolloutEngine] = []


@pytest.fixture(autouse=True)
def _engine_options(request: pytest.FixtureRequest) -> Iterator[None]:
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "sglang" in callspec.params.values():
        OPTIONS["sglang"] = request.getfixturevalue("sglang_options")
    yield
    OPTIONS.clear()
    while _BUILT:
        _BUILT.pop().close()


def rollout_engine(name: str, model_dir, seed: int = 0) -> RolloutEngine:
    engine = build_rollout_engine(name, model_dir, seed=seed, options=OPTIONS.get(name))
    assert isinstance(engine, RolloutEngine)
    _BUILT.append(engine)
    return engine


def wait_until_generating(engine: RolloutEngine, thread: threading.Thread, idle_bytes: int) -> None:
    """Return once the engine decodes (so an abort or sleep now cuts a running batch short)."""
    if not hasattr(engine, "running_requests"):
        wait_for_kv_cache(thread, above_bytes=idle_bytes)
        return
    deadline = time.monotonic() + 30
    while thread.is_alive() and time.monotonic() < deadline:
        if engine.running_requests() > 0:
            return
        time.sleep(0.005)
    pytest.fail("the server never reported the batch running")


def training_engine(name: str, model_dir, cfg: ActorConfig | None = None, temperature: float = 1.0):
    engine = build_training_engine(name, model_dir, cfg or ActorConfig(), 10, temperature, seed=0)
    assert isinstance(engine, TrainingEngine)
    return engine


def requests(engine: RolloutEngine, count: int) -> list[GenerationRequest]:
    """Prompts of different lengths, so that batches are padded."""
    tok = engine.tokenizer
    prompts = [f"{i % 10}+{(3 * i) % 10}=" if i % 3 else f"{i}+{i * 7}=" for i in range(count)]
    return [
        GenerationRequest(str(i), [tok.bos_token_id, *tok.encode(p, add_special_tokens=False)])
        for i, p in enumerate(prompts)
    ]


def records(results: list[GenerationResult]) -> list[dict]:
    """Trajectory records with a spread of advantages, pi_old a little off the policy."""
    return [
        {
            "prompt_ids": r.prompt_ids,
            "response_ids": r.response_ids,
            "old_log_probs": [x - 0.05 for x in r.log_probs],
            "advantages": [((i % 5) - 2) / 2.0] * len(r.response_ids),
        }
        for i, r in enumerate(results)
    ]


def train_batch(results: list[GenerationResult], pad_token_id: int) -> dict[str, torch.Tensor]:
    return collate(records(results), pad_token_id, ["old_log_probs", "advantages"])


def distinct_bytes(named: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Bytes of the storages behind ``named``, a tied weight counted once."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for _, t in named}.values())


def generate_in_thread(
    engine: RolloutEngine, reqs: list[GenerationRequest], params: SamplingParams
) -> tuple[threading.Thread, list[GenerationResult], list[BaseException]]:
    out: list[GenerationResult] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.extend(engine.generate(reqs, params))
        except BaseException as exc:  # surfaced by the test, not lost in the thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out, errors


def wait_for_kv_cache(thread: threading.Thread, above_bytes: int, timeout_seconds: float = 30.0) -> int:
    """Live host tensor bytes once they exceed ``above_bytes`` (the KV cache is in use).

    Once the cache holds keys, the first forward has run, so at least one token is returned
    whatever happens next. Fails if generation ends first or never allocates a cache.
    """
    deadline = time.monotonic() + timeout_seconds
    while thread.is_alive() and time.monotonic() < deadline:
        busy = live_tensor_bytes("cpu")
        if busy > above_bytes:
            return busy
        time.sleep(0.005)
    pytest.fail(f"no KV cache beyond {above_bytes} bytes was seen while generating")


# -- log-probs ----------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize(("training", "rollout"), PAIRS)
def test_rollout_log_probs_equal_training_log_probs(
    tiny_model_dir, training: str, rollout: str, temperature: float
) -> None:
    """After one update and a sync, both engines score the sampled tokens alike.

    Tolerance 1e-5 (absolute, on log-probs of order -1): the rollout side left-pads and
    decodes one token at a time against a KV cache, the training side right-pads and runs
    the whole sequence at once, so float32 sums run in different orders; that moves a
    log-prob by about 1e-6. The faults this guards against (a different temperature, an
    off-by-one position, padding leaking into attention, stale weights) move it by 1e-2 or more.
    """
    trainer = training_engine(training, tiny_model_dir, ActorConfig(lr=1e-2), temperature)
    engine = rollout_engine(rollout, tiny_model_dir, seed=3)
    params = SamplingParams(temperature, 0.9, 6)
    pad = int(trainer.tokenizer.pad_token_id)
    trainer.train_batch(
        train_batch(engine.generate(requests(engine, 16), params), pad), build_actor_loss_fn(ActorConfig())
    )
    engine.update_weights(trainer.export_weights(), version=1)
    # every answer runs its 6 tokens (EOS sampled mid-way included): after a 1e-2 step the
    # policy may put most of its mass on ending at once, and a check of one token per answer
    # would hinge on the sampler's random stream
    results = engine.generate(requests(engine, 48), SamplingParams(temperature, 0.9, 6, ignore_eos=True))
    recs = records(results)
    batch = collate(recs, pad)
    recomputed = scatter_response(trainer.compute_log_probs(batch)["log_probs"], recs)
    total = 0
    for result, again in zip(results, recomputed, strict=True):
        assert len(result.log_probs) == len(again) > 0
        torch.testing.assert_close(torch.tensor(again), torch.tensor(result.log_probs), atol=1e-5, rtol=0)
        total += len(again)
    assert total > 48
    # pi_old is the current policy unless pinned
    assert torch.equal(
        trainer.compute_log_probs(batch, pi_old=True)["log_probs"],
        trainer.compute_log_probs(batch)["log_probs"],
    )


@pytest.mark.parametrize("training", TRAINING)
def test_pinned_pi_old_survives_updates_bit_for_bit(tiny_model_dir, training: str) -> None:
    """R-2.8: old log-probs use the weights of local update 0 until the pin is cleared."""
    trainer = training_engine(training, tiny_model_dir, ActorConfig(lr=1e-2))
    engine = rollout_engine("torch", tiny_model_dir, seed=5)
    batch = train_batch(engine.generate(requests(engine, 12), SamplingParams(1.0, 1.0, 6)), 0)
    before = trainer.compute_log_probs(batch)["log_probs"]
    trainer.snapshot_pi_old()
    trainer.train_batch(batch, build_actor_loss_fn(ActorConfig()))
    after = trainer.compute_log_probs(batch)["log_probs"]
    assert not torch.equal(after, before)
    assert torch.equal(trainer.compute_log_probs(batch, pi_old=True)["log_probs"], before)
    assert torch.equal(trainer.compute_log_probs(batch)["log_probs"], after)  # swapped back bitwise
    trainer.clear_pi_old()
    assert torch.equal(trainer.compute_log_probs(batch, pi_old=True)["log_probs"], after)


# -- gradients ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "split", [{"micro_batch_size": 1}, {"max_tokens_per_micro_batch": 40}]
)
@pytest.mark.parametrize("training", TRAINING)
def test_updates_do_not_depend_on_the_micro_batch_split(tiny_model_dir, training: str, split: dict) -> None:
    """Two optimizer steps, whole batch against a split one: same loss, same (pre-clip) grad
    norm, same weights. Adam's step is nearly lr * sign(grad), so the grad norm is what sees
    a gradient scaled wrongly; the weights see a gradient wrong per element.

    Tolerances: only float32 summation order differs (about 1e-7 relative), except that
    Adam divides each gradient by its own magnitude, which amplifies that noise on entries
    whose gradient is near Adam's eps; those move by at most lr, so weights get lr / 100 (all
    but 1 in 10,000) and lr / 10 (every one). A lost or double-counted micro-batch flips the
    sign of many entries: errors of 2 lr.
    """
    engine = rollout_engine("torch", tiny_model_dir, seed=1)
    batch = train_batch(engine.generate(requests(engine, 12), SamplingParams(1.0, 1.0, 6)), 0)
    loss_fn = build_actor_loss_fn(ActorConfig())
    whole = training_engine(training, tiny_model_dir, ActorConfig(lr=1e-3))
    cut = training_engine(training, tiny_model_dir, ActorConfig(lr=1e-3, **split))
    start = {name: t.clone() for name, t in whole.export_weights()}
    for _ in range(2):
        expected, got = whole.train_batch(batch, loss_fn), cut.train_batch(batch, loss_fn)
        assert got["actor/loss"] == pytest.approx(expected["actor/loss"], rel=1e-5, abs=1e-7)
        assert got["actor/grad_norm"] == pytest.approx(expected["actor/grad_norm"], rel=1e-5)
        assert expected["actor/grad_norm"] > 0
    final = dict(cut.export_weights())
    # As in tests/unit/test_data_parallel.py: all but 1 in 10,000 weights within lr / 100 (on
    # one CPU a weight whose gradient sat at Adam's eps moved 1.0017e-5), none beyond lr / 10,
    # which still tells a lost or doubled micro-batch (2 lr on many entries) from the update
    moved, off, total = 0, 0, 0
    for name, tensor in whole.export_weights():
        torch.testing.assert_close(final[name], tensor, atol=1e-4, rtol=0)
        off += int(((final[name] - tensor).abs() > 1e-5).sum())
        total += tensor.numel()
        moved += int(not torch.equal(tensor, start[name]))
    assert off <= total // 10_000
    assert moved > len(start) // 2


# -- lifecycle ----------------------------------------------------------------------------
@pytest.mark.parametrize("rollout", ROLLOUT)
def test_sleep_wake_round_trip(tiny_model_dir, rollout: str) -> None:
    """A seeded generation is identical before and after sleep/wake; no generation while asleep."""
    engine = rollout_engine(rollout, tiny_model_dir)
    params = SamplingParams(1.0, 1.0, 8, seed=11)
    reqs = requests(engine, 12)
    before = engine.generate(reqs, params)
    weights = {name: t.clone() for name, t in engine.export_weights()}
    engine.sleep()
    engine.sleep()  # idempotent
    with pytest.raises(EngineStateError, match="asleep"):
        engine.generate(reqs, params)
    engine.wake_up()
    after = engine.generate(reqs, params)
    assert [(r.response_ids, r.log_probs) for r in after] == [(r.response_ids, r.log_probs) for r in before]
    assert len({tuple(r.response_ids) for r in before}) > 3  # really sampled, not greedy
    assert all(torch.equal(t, weights[name]) for name, t in engine.export_weights())


@pytest.mark.parametrize("rollout", ROLLOUT)
def test_sleep_frees_the_kv_cache_even_mid_generation(tiny_model_dir, rollout: str) -> None:
    """Measured, not counted: the bytes of live tensor storages in this process (every tensor
    the garbage collector can see). While a batch decodes the process holds the weights plus
    a KV cache; ``sleep`` called in the middle aborts it, and afterwards the engine holds its
    weights once and no KV cache. (On a GPU the weights also leave the device: see the
    gpu-marked test.)"""
    remote = rollout in REMOTE
    before_engine = live_tensor_bytes("cpu")
    engine = rollout_engine(rollout, tiny_model_dir)
    weight_bytes = 0 if remote else distinct_bytes(engine.export_weights())
    idle = live_tensor_bytes("cpu")
    assert weight_bytes <= idle - before_engine <= weight_bytes + SLACK_BYTES
    thread, out, errors = generate_in_thread(
        engine, requests(engine, 16), SamplingParams(1.0, 1.0, LONG, ignore_eos=True)
    )
    wait_until_generating(engine, thread, idle + SLACK_BYTES)
    engine.sleep()
    thread.join(timeout=30)
    assert not thread.is_alive() and not errors
    assert [r.stop_reason for r in out] == ["aborted"] * 16
    asleep = live_tensor_bytes("cpu")
    assert asleep - before_engine <= weight_bytes + SLACK_BYTES
    del out
    engine.wake_up()
    assert len(engine.generate(requests(engine, 2), SamplingParams(1.0, 1.0, 4))) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("rollout", [r for r in ROLLOUT if r not in REMOTE])
def test_sleep_moves_weights_off_the_gpu(tiny_model_dir, rollout: str) -> None:
    """On a GPU, sleep gives the device memory back (the allocator's own count), and a seeded
    generation after wake_up is what it was before."""
    torch.cuda.synchronize()
    before_engine = torch.cuda.memory_allocated()
    engine = build_rollout_engine(rollout, tiny_model_dir, seed=0, device="cuda")
    weight_bytes = distinct_bytes(engine.export_weights())
    params, reqs = SamplingParams(1.0, 1.0, 8, seed=5), requests(engine, 8)
    first = engine.generate(reqs, params)
    assert torch.cuda.memory_allocated() - before_engine >= weight_bytes
    engine.sleep()
    assert torch.cuda.memory_allocated() - before_engine <= 4096
    engine.wake_up()
    again = engine.generate(reqs, params)
    assert [(r.response_ids, r.log_probs) for r in again] == [(r.response_ids, r.log_probs) for r in first]


@pytest.mark.gpu
def test_weights_loaded_while_asleep_reach_the_fused_projections_after_wake(tiny_model_dir) -> None:
    """The built-in engine's model reads q/k/v from one stacked weight: moving the weights off
    the GPU and back cuts the parameters from their stack, so wake_up stacks them again, with
    what was loaded while asleep."""
    engine = build_rollout_engine("torch", tiny_model_dir, seed=0, device="cuda")
    name = "model.layers.0.self_attn.k_proj.weight"
    new = torch.randn_like(dict(engine.export_weights())[name]).cpu()
    engine.sleep()
    engine.update_weights([(name, new)], 1)
    engine.wake_up()
    attn = engine.model.model.layers[0].self_attn
    assert attn.fused is not None
    rows = attn.q_proj.out_features
    torch.testing.assert_close(attn.fused.weight[rows : rows + attn.k_proj.out_features].cpu(), new, rtol=0, atol=0)
    assert attn.k_proj.weight.data_ptr() == attn.fused.weight[rows:].data_ptr()  # a view: later loads reach it


@pytest.mark.parametrize("rollout", ROLLOUT)
def test_abort_returns_partial_output(tiny_model_dir, rollout: str) -> None:
    """Abort from another thread mid-generation: every request returns its tokens so far."""
    engine = rollout_engine(rollout, tiny_model_dir)
    idle = live_tensor_bytes("cpu")
    thread, out, errors = generate_in_thread(
        engine, requests(engine, 4), SamplingParams(1.0, 1.0, LONG, ignore_eos=True)
    )
    wait_until_generating(engine, thread, idle + 4096)
    assert engine.abort() == 4
    thread.join(timeout=30)
    assert not thread.is_alive() and not errors
    assert [r.stop_reason for r in out] == ["aborted"] * 4
    for r in out:
        assert 0 < len(r.response_ids) < LONG
        assert len(r.log_probs) == len(r.token_versions) == len(r.response_ids)
        assert all(x <= 0 for x in r.log_probs)
    # the next call is not aborted by the last one
    again = engine.generate(requests(engine, 2), SamplingParams(1.0, 1.0, 5, ignore_eos=True))
    assert [len(r.response_ids) for r in again] == [5, 5] and {r.stop_reason for r in again} == {"length"}


@pytest.mark.parametrize(("training", "rollout"), PAIRS)
def test_versions_follow_the_weights(tiny_model_dir, training: str, rollout: str) -> None:
    """update_weights sets the version; each generated token carries the version it was
    sampled under, also when a partial rollout continues (R-1.4, R-2.5)."""
    engine = rollout_engine(rollout, tiny_model_dir)
    trainer = training_engine(training, tiny_model_dir)
    assert engine.version == 0
    first = engine.generate(requests(engine, 4), SamplingParams(1.0, 1.0, 3, ignore_eos=True))
    assert all(r.token_versions == [0, 0, 0] for r in first)
    engine.update_weights(trainer.export_weights(), version=3)
    assert engine.version == 3
    continued = engine.generate(
        [GenerationRequest(r.request_id, r.prompt_ids, r.response_ids) for r in first],
        SamplingParams(1.0, 1.0, 5, ignore_eos=True),
    )
    for old, new in zip(first, continued, strict=True):
        assert new.response_ids[:3] == old.response_ids and len(new.response_ids) == 5
        assert new.token_versions == [3, 3] and len(new.log_probs) == 2
    engine.sleep()
    engine.update_weights(trainer.export_weights(), version=4)
    engine.wake_up()
    assert engine.version == 4
    if isinstance(engine, SparseWeightUpdates):
        name, tensor = next(iter(engine.export_weights()))
        engine.update_weights_sparse([(name, torch.tensor([0]), tensor.reshape(-1)[:1].clone())], version=5)
        assert engine.version == 5
    assert all(
        r.token_versions == [engine.version]
        for r in engine.generate(requests(engine, 2), SamplingParams(1.0, 1.0, 1))
    )


# -- weights ------------------------------------------------------------------------------
@pytest.mark.parametrize(("training", "rollout"), PAIRS)
def test_export_round_trip_is_bit_exact(tiny_model_dir, training: str, rollout: str) -> None:
    """training export -> rollout update_weights -> rollout export: equal bit for bit, same
    names and dtypes, awake and asleep (R-4.6, R-8)."""
    trainer = training_engine(training, tiny_model_dir, ActorConfig(lr=1e-2))
    engine = rollout_engine(rollout, tiny_model_dir)
    loss_fn = build_actor_loss_fn(ActorConfig())
    batch = train_batch(engine.generate(requests(engine, 8), SamplingParams(1.0, 1.0, 4)), 0)
    on_disk = {name: t.clone() for name, t in engine.export_weights()}
    for asleep in (False, True):
        trainer.train_batch(batch, loss_fn)
        exported = {name: t.clone() for name, t in trainer.export_weights()}
        assert any(not torch.equal(exported[n], on_disk[n]) for n in on_disk)
        if asleep:
            engine.sleep()
        engine.update_weights(exported.items(), version=2)
        if asleep:
            engine.wake_up()
        loaded = dict(engine.export_weights())
        assert set(loaded) == set(exported)
        for name, tensor in exported.items():
            assert loaded[name].dtype == tensor.dtype
            assert torch.equal(loaded[name].cpu(), tensor.cpu()), name


# -- LoRA adapters synced alone -----------------------------------------------------------
LORA_ROLLOUT = [name for name in ROLLOUT if ROLLOUT_ENGINES[name].loads_lora_adapters]


@pytest.mark.parametrize("rollout", LORA_ROLLOUT)
def test_an_engine_that_loads_adapters_serves_the_lora_policy(tiny_model_dir, rollout: str) -> None:
    """An engine whose entry says ``loads_lora_adapters``, sent a LoRA trainer's adapters alone
    (awake, then asleep), scores its samples as the trainer does (tolerance as in the log-prob
    test above) and exports the merged weights the trainer would have sent, bit for bit."""
    engine = rollout_engine(rollout, tiny_model_dir)
    trainer = training_engine("torch", tiny_model_dir, ActorConfig(lr=1e-2, lora={"rank": 4, "alpha": 8.0}))
    loss_fn = build_actor_loss_fn(ActorConfig())
    params = SamplingParams(1.0, 1.0, 5, ignore_eos=True)
    for version, asleep in ((1, False), (2, True)):
        trainer.train_batch(train_batch(engine.generate(requests(engine, 8), params), 0), loss_fn)
        sent = list(trainer.export_adapters())
        assert sent and all(".lora_A." in name or ".lora_B." in name for name, _ in sent)
        if asleep:
            engine.sleep()
        engine.update_weights(iter(sent), version=version)
        if asleep:
            engine.wake_up()
        results = engine.generate(requests(engine, 8), params)
        scored = [{"prompt_ids": r.prompt_ids, "response_ids": r.response_ids} for r in results]
        again = scatter_response(trainer.compute_log_probs(collate(scored, 0))["log_probs"], scored)
        for result, values in zip(results, again, strict=True):
            assert result.token_versions == [version] * len(result.response_ids)
            torch.testing.assert_close(torch.tensor(result.log_probs), torch.tensor(values), atol=1e-5, rtol=0)
        merged = dict(trainer.export_weights())
        assert all(torch.equal(tensor.cpu(), merged[name].cpu()) for name, tensor in engine.export_weights())
