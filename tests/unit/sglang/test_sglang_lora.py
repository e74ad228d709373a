"""LoRA adapters synced alone to the sglang backend (``sglang/lora.py``), against the CPU test
server's LoRA serving (``cpu_lora.py``, held to sglang's own request types): the folder the
backend writes is a PEFT adapter that ``peft`` loads to the built-in engine's weights, the
server loads it by name and every generate names it, a partial sync completes the kept
adapter, a sync while asleep waits for the wake-up, full weights replace the adapter, a refusal
changes nothing, and no folder outlives what is served. Then the config that launches sglang
with LoRA for such a run."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from rl_train.config import Config, ConfigError, load_config
from rl_train.engines.model.loading import load_model
from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams
from rl_train.engines.rollout.registry import build_rollout_engine, loads_lora_adapters
from rl_train.engines.rollout.sglang.client import RolloutServerError
from rl_train.engines.rollout.sglang.engine import SglangRolloutEngine
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.torch_engine import TorchTrainingEngine
from rl_train.storage.records import collate, scatter_response

RANK = 4
TARGETS = ["q_proj", "v_proj", "down_proj"]


@pytest.fixture(scope="module")
def trainer(tiny_model_dir: Path) -> TorchTrainingEngine:
    """A LoRA policy whose adapters moved away from the base (B no longer 0)."""
    engine = TorchTrainingEngine(
        tiny_model_dir, ActorConfig(lora={"rank": RANK, "alpha": 8.0, "target_modules": TARGETS}), horizon_steps=10, seed=0
    )
    shift(engine, seed=0)
    return engine


def shift(trainer: TorchTrainingEngine, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted((n, p) for n, p in trainer.model.named_parameters() if p.requires_grad):
            param.add_(torch.randn(param.shape, generator=generator) * 0.2)


def adapters(trainer: TorchTrainingEngine) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in trainer.export_adapters()}


@pytest.fixture
def engine(tiny_model_dir: Path, sglang_options: dict[str, Any], tmp_path: Path) -> Iterator[SglangRolloutEngine]:
    options = {**sglang_options, "staging_dir": str(tmp_path), "lora": {"max_rank": 8, "target_modules": "all"}}
    built = build_rollout_engine("sglang", tiny_model_dir, seed=1, options=options)
    assert isinstance(built, SglangRolloutEngine)
    yield built
    built.close()


def server_lora(engine: SglangRolloutEngine) -> dict[str, Any]:
    return httpx.get(f"{engine.client.url}/test/state", timeout=10).json()["lora"]


def staged(engine: SglangRolloutEngine) -> list[str]:
    return sorted(p.name for p in engine._staging_root.glob("v*"))


def generate(engine: Any, count: int = 12) -> list[GenerationResult]:
    tok = engine.tokenizer
    reqs = [
        GenerationRequest(str(i), [tok.bos_token_id, *tok.encode(f"{i % 10}+{(3 * i) % 7}=", add_special_tokens=False)])
        for i in range(count)
    ]
    return engine.generate(reqs, SamplingParams(1.0, 1.0, 6, seed=5, ignore_eos=True))


def assert_trainer_agrees(trainer: TorchTrainingEngine, results: list[GenerationResult]) -> None:
    """The log-probs served are the trainer's for the same tokens (float32, merged vs unmerged)."""
    records = [{"prompt_ids": r.prompt_ids, "response_ids": r.response_ids} for r in results]
    batch = collate(records, int(trainer.tokenizer.pad_token_id))
    again = scatter_response(trainer.compute_log_probs(batch)["log_probs"], records)
    for result, values in zip(results, again, strict=True):
        torch.testing.assert_close(torch.tensor(result.log_probs), torch.tensor(values), atol=1e-5, rtol=0)


def test_an_adapter_sync_is_served_by_name_and_replaces_the_last(
    engine: SglangRolloutEngine, trainer: TorchTrainingEngine
) -> None:
    base = generate(engine)
    engine.update_weights(iter(adapters(trainer).items()), version=1)
    first = engine.adapter.name
    assert first is not None and server_lora(engine)["loaded"] == [first]
    assert staged(engine) == [first]  # the adapter's folder is its name on the server
    results = generate(engine)
    assert server_lora(engine)["requests"][first] == 1  # the generate named it (lora_path)
    assert all(r.token_versions == [1] * len(r.response_ids) for r in results)
    assert [r.log_probs for r in results] != [r.log_probs for r in base]
    assert_trainer_agrees(trainer, results)
    merged = dict(trainer.export_weights())
    assert all(torch.equal(tensor, merged[name]) for name, tensor in engine.export_weights())

    shift(trainer, seed=1)  # the module's trainer moves on: each test syncs what it has now
    engine.update_weights(iter(adapters(trainer).items()), version=2)
    second = engine.adapter.name
    assert second != first and server_lora(engine)["loaded"] == [second]  # the last one unloaded
    assert staged(engine) == [second]
    assert_trainer_agrees(trainer, generate(engine))


def test_a_batch_in_flight_keeps_its_weights_while_another_names_an_adapter(
    engine: SglangRolloutEngine, trainer: TorchTrainingEngine
) -> None:
    """The test server's own contract (each batch under its adapter from first token to last),
    which every log-prob check here rests on: a base batch still decoding when a generate names
    an adapter ends as it would alone, and the adapter's batch agrees with the trainer."""
    engine.update_weights(iter(adapters(trainer).items()), version=1)
    url = engine.client.url
    params = {"temperature": 1.0, "max_new_tokens": 160, "ignore_eos": True, "sampling_seed": 3}
    body = {"input_ids": [[1, 4, 14, 4, 18], [1, 9, 14, 7, 18]] * 2, "sampling_params": params, "return_logprob": True}

    def base() -> list[Any]:
        answer = httpx.post(f"{url}/generate", json=body, timeout=60)
        answer.raise_for_status()
        return [r["meta_info"]["output_token_logprobs"] for r in answer.json()]

    alone = base()
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(base)
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/get_load", timeout=10).json()[0]["num_reqs"] == 0 and not in_flight.done():
            assert time.monotonic() < deadline, "the base batch never started decoding"
            time.sleep(0.005)
        assert_trainer_agrees(trainer, generate(engine))
        assert in_flight.result() == alone


def test_the_adapter_folder_loads_with_peft_as_the_torch_engine_serves_it(
    engine: SglangRolloutEngine, trainer: TorchTrainingEngine, tiny_model_dir: Path
) -> None:
    from peft import PeftModel

    sent = adapters(trainer)
    engine.update_weights(iter(sent.items()), version=3)
    assert engine.adapter.folder is not None
    config = json.loads((engine.adapter.folder / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", RANK, RANK)
    assert config["target_modules"] == sorted(TARGETS)
    assert config["base_model_name_or_path"] == str(tiny_model_dir)

    torch_engine = build_rollout_engine("torch", tiny_model_dir, seed=0)
    torch_engine.update_weights(iter(sent.items()), version=3)
    served = load_model(tiny_model_dir)
    served.load_state_dict(dict(torch_engine.export_weights()))
    adapted = PeftModel.from_pretrained(load_model(tiny_model_dir), str(engine.adapter.folder))
    ids = torch.tensor([[1, 5, 9, 12, 7, 3, 22, 8], [1, 4, 4, 30, 2, 6, 11, 19]])
    with torch.no_grad():
        expected, got = served(input_ids=ids).logits, adapted(input_ids=ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert not torch.allclose(got, load_model(tiny_model_dir)(input_ids=ids).logits, atol=1e-3)  # not the base


def test_a_partial_sync_completes_the_kept_adapter(engine: SglangRolloutEngine, trainer: TorchTrainingEngine, tiny_model_dir: Path) -> None:
    """``delta`` hands over only the changed tensors: the folder is still the whole adapter."""
    first = adapters(trainer)
    engine.update_weights(iter(first.items()), version=1)
    changed = {name: tensor + 0.3 for name, tensor in first.items() if ".down_proj.lora_B." in name}
    engine.update_weights(iter(changed.items()), version=2)
    from safetensors.torch import load_file

    assert engine.adapter.folder is not None
    written = load_file(str(engine.adapter.folder / "adapter_model.safetensors"))
    expected = {**first, **changed}
    assert sorted(written) == sorted(f"base_model.model.{name}" for name in expected)
    assert all(torch.equal(written[f"base_model.model.{name}"], t) for name, t in expected.items())
    torch_engine = build_rollout_engine("torch", tiny_model_dir, seed=0)
    torch_engine.update_weights(iter(first.items()), version=1)
    torch_engine.update_weights(iter(changed.items()), version=2)
    mine = dict(torch_engine.export_weights())
    assert all(torch.equal(tensor, mine[name]) for name, tensor in engine.export_weights())
    assert staged(engine) == [engine.adapter.name]


def test_a_partial_first_sync_or_a_mixed_one_is_refused(engine: SglangRolloutEngine, trainer: TorchTrainingEngine) -> None:
    sent = adapters(trainer)
    only_a = {name: t for name, t in sent.items() if ".lora_A." in name}
    with pytest.raises(ValueError, match=r"arrived without \['lora_B'\]: the first adapter sync sends both parts"):
        engine.update_weights(iter(only_a.items()), version=1)
    full = dict(engine.export_weights())
    with pytest.raises(ValueError, match="LoRA adapters .* and full weights .* together"):
        engine.update_weights(iter({**full, **sent}.items()), version=1)
    assert engine.version == 0 and engine.adapter.name is None
    assert server_lora(engine)["loaded"] == [] and staged(engine) == []


def test_while_asleep_the_adapter_is_staged_and_loaded_at_wake_up(
    engine: SglangRolloutEngine, trainer: TorchTrainingEngine
) -> None:
    engine.sleep()
    engine.update_weights(iter(adapters(trainer).items()), version=4)
    assert server_lora(engine)["loaded"] == [] and len(staged(engine)) == 1
    engine.wake_up()
    assert engine.version == 4 and server_lora(engine)["loaded"] == [engine.adapter.name]
    assert staged(engine) == [engine.adapter.name]
    results = generate(engine)
    assert all(r.token_versions == [4] * len(r.response_ids) for r in results)
    assert_trainer_agrees(trainer, results)


def test_full_weights_replace_the_adapter(engine: SglangRolloutEngine, trainer: TorchTrainingEngine) -> None:
    base = dict(engine.export_weights())
    engine.update_weights(iter(adapters(trainer).items()), version=1)
    pushed = {name: tensor + 0.01 for name, tensor in base.items()}
    engine.sleep()
    engine.update_weights(iter(pushed.items()), version=2)  # asleep: the adapter goes at wake-up
    engine.wake_up()
    assert engine.adapter.name is None and server_lora(engine)["loaded"] == []
    assert all(torch.equal(tensor, pushed[name]) for name, tensor in engine.export_weights())
    before = server_lora(engine)["requests"].get("base", 0)
    generate(engine)
    assert server_lora(engine)["requests"]["base"] == before + 1  # no lora_path any more
    assert len(staged(engine)) == 1 and engine.adapter.folder is None  # the full weights' folder only
    changed = {name: t for name, t in adapters(trainer).items() if ".lora_B." in name}
    with pytest.raises(ValueError, match="arrived without"):  # the kept adapter went with it
        engine.update_weights(iter(changed.items()), version=3)


def fail_once(server: str, endpoint: str) -> None:
    """The test server answers the next call of ``endpoint`` with an HTTP 500."""
    httpx.post(f"{server}/test/fault", json={"mode": "error", "times": 1, "endpoint": endpoint}, timeout=10).raise_for_status()


def test_a_refused_adapter_changes_nothing(
    engine: SglangRolloutEngine, trainer: TorchTrainingEngine, sglang_server: str
) -> None:
    sent = adapters(trainer)
    engine.update_weights(iter(sent.items()), version=1)
    served = engine.adapter.name
    fail_once(sglang_server, "/load_lora_adapter")
    bigger = {name: tensor * 2 for name, tensor in sent.items()}
    with pytest.raises(RolloutServerError, match=r"load_lora_adapter: HTTP 500: injected server error \(the server must run with --enable-lora"):
        engine.update_weights(iter(bigger.items()), version=2)
    assert (engine.version, engine.adapter.name, staged(engine)) == (1, served, [served])
    assert_trainer_agrees(trainer, generate(engine))
    with pytest.raises(ValueError, match=r"rank 4, above rollout.sglang.lora.max_rank 2"):
        engine.adapter.settings = engine.cfg.lora.model_copy(update={"max_rank": 2})  # type: ignore[union-attr]
        engine.update_weights(iter(bigger.items()), version=2)
    assert (engine.version, engine.adapter.name, staged(engine)) == (1, served, [served])


def test_an_adapter_the_server_keeps_is_logged_and_the_sync_stands(
    engine: SglangRolloutEngine, trainer: TorchTrainingEngine, sglang_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    sent = adapters(trainer)
    engine.update_weights(iter(sent.items()), version=1)
    first = engine.adapter.name
    fail_once(sglang_server, "/unload_lora_adapter")
    with caplog.at_level("WARNING"):
        engine.update_weights(iter(sent.items()), version=2)
    assert f"the LoRA adapter {first} stays loaded on the server" in caplog.text
    assert engine.version == 2 and sorted(server_lora(engine)["loaded"]) == sorted([first, engine.adapter.name])
    assert staged(engine) == [engine.adapter.name]
    results = generate(engine)
    assert server_lora(engine)["requests"][engine.adapter.name] == 1
    assert_trainer_agrees(trainer, results)


def test_adapters_go_through_the_staging_folder_whichever_weight_update(
    tiny_model_dir: Path, sglang_options: dict[str, Any], trainer: TorchTrainingEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """weight_update=distributed broadcasts full weights; adapters (megabytes) still load from a
    folder, and a broadcast full update replaces them."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    built = build_rollout_engine("sglang", tiny_model_dir, options={**sglang_options, "weight_update": "distributed"})
    assert isinstance(built, SglangRolloutEngine)
    try:
        base = dict(built.export_weights())
        built.update_weights(iter(adapters(trainer).items()), version=1)
        assert server_lora(built)["loaded"] == [built.adapter.name] and built._group is None
        assert_trainer_agrees(trainer, generate(built))
        built.update_weights(iter(base.items()), version=2)
        assert built._group is not None and built.adapter.name is None and server_lora(built)["loaded"] == []
        assert staged(built) == []
        assert all(torch.equal(tensor, base[name]) for name, tensor in built.export_weights())
    finally:
        built.close()


def test_close_unloads_the_adapter_and_leaves_no_folder(
    tiny_model_dir: Path, sglang_options: dict[str, Any], tmp_path: Path, trainer: TorchTrainingEngine
) -> None:
    for staging in (str(tmp_path), None):  # a folder of the user's, and the engine's own
        built = build_rollout_engine("sglang", tiny_model_dir, options={**sglang_options, "staging_dir": staging})
        assert isinstance(built, SglangRolloutEngine)
        built.update_weights(iter(adapters(trainer).items()), version=1)
        root = built._staging_root
        assert len(staged(built)) == 1
        built.close()
        assert server_lora(built)["loaded"] == []
        assert not list(root.glob("v*"))
    assert tmp_path.exists()


# -- config ---------------------------------------------------------------------------------
def test_a_run_that_syncs_adapters_to_sglang_launches_it_with_lora(tmp_path: Path) -> None:
    assert loads_lora_adapters("sglang")
    config = Config.model_validate({"rollout": {"engine": "sglang"}, "actor": {"lora": {"rank": 4, "target_modules": TARGETS}}})
    lora = config.rollout.sglang.lora
    assert lora is not None and (lora.max_rank, lora.target_modules) == (4, TARGETS)
    options = config.rollout.engine_options()
    assert options is not None and options["lora"] == {"max_rank": 4, "target_modules": TARGETS}  # what each replica gets
    assert lora.launch_args() == ["--enable-lora", "--max-lora-rank", "4", "--lora-target-modules", *TARGETS]
    every = Config.model_validate({"rollout": {"engine": "sglang", "sglang": {"lora": {"max_rank": 16}}}, "actor": {"lora": {}}})
    assert every.rollout.sglang.lora is not None
    assert every.rollout.sglang.lora.launch_args()[-4:] == ["--max-lora-rank", "16", "--lora-target-modules", "all"]
    merged = Config.model_validate({"rollout": {"engine": "sglang"}, "actor": {"lora": {"sync": "merged"}}})
    assert merged.rollout.sglang.lora is None  # merged full weights: no LoRA on the server


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["actor.lora.rank=16", "rollout.sglang.lora.max_rank=8"], r"actor.lora.rank: got 16, above rollout.sglang.lora.max_rank 8"),
        (["actor.lora.target_modules=[q_proj]"], r"actor.lora.target_modules: \['q_proj'\] without \['v_proj'\]: sglang stacks"),
        (["actor.lora.target_modules=[up_proj]"], "up_proj without gate_proj"),
        (["actor.lora.target_modules=[q_proj, v_proj, c_attn]"], r"\['c_attn'\] are layers sglang's LoRA does not adapt"),
        (["rollout.sglang.lora.target_modules=[q_proj, v_proj]"], "'all-linear' adapts every linear layer, and rollout.sglang.lora.target_modules"),
        (["actor.lora.target_modules=[o_proj]", "rollout.sglang.lora.target_modules=[q_proj, v_proj]"], r"\['o_proj'\] are not in rollout.sglang.lora.target_modules"),
        (["rollout.sglang.lora.target_modules=[qkv]"], r"rollout.sglang.lora.target_modules: got \['qkv'\]: sglang adapts q_proj"),
    ],
)  # fmt: skip
def test_lora_sglang_cannot_serve_is_refused_at_load(tmp_path: Path, overrides: list[str], message: str) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("rollout: {engine: sglang}\nactor: {lora: {}}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(path, overrides)


def test_server_lora_without_adapters_to_sync_must_be_whole(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("rollout: {engine: sglang, sglang: {lora: {max_rank: 8}}}\n")
    with pytest.raises(ConfigError, match=r"rollout.sglang.lora: got .*nothing fills max_rank and target_modules"):
        load_config(path, [])
    config = load_config(path, ["rollout.sglang.lora.target_modules=all"])
    assert config.rollout.sglang.lora is not None and config.rollout.sglang.lora.launch_args()[0] == "--enable-lora"
