"""The discriminative reward model (engines/reward/reward_model.py, chat_encoding.py,
model_config.py): the dual-tokenizer round trip on text with tool calls, batching, errors on a
directory that is no reward model, normalisation, sleep and wake, infra on a failed batch."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rl_train.engines.model.response_decoder import TransformersDecoder
from rl_train.engines.model.tokenizer import build_char_tokenizer
from rl_train.engines.reward.base import Message, ModelReward, Trajectory
from rl_train.engines.reward.chat_encoding import ChatEncoder
from rl_train.engines.reward.config import RewardConfig
from rl_train.engines.reward.model_config import RewardModelConfig, check_reward_models
from rl_train.engines.reward.reward_model import RewardModel, RewardModelError
from rl_train.engines.reward.router import RewardRouter
from rl_train.engines.reward.tiny_rm import train_tiny_rm
from rl_train.engines.reward.trajectory import TrajectoryReader
from rl_train.engines.rollout.protocol import EngineStateError

SOURCE = "arith/single_digit_sum"
CALL = '<tool_call>{"name":"calculator","arguments":{"expression":"345+678"}}</tool_call>'


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A briefly trained tiny reward model: a real directory with its own tokenizer (what it
    has learnt does not matter here; test_reward_model_init.py checks that)."""
    out = tmp_path_factory.mktemp("rm") / "tiny-rm"
    train_tiny_rm(out, steps=10, progress=lambda _: None)
    return out


def answer(prompt: str, response: str, truth: str = "7") -> Trajectory:
    return Trajectory.of_answer({"prompt": prompt, "data_source": SOURCE, "ground_truth": truth}, response)


def load(rm_dir: Path, **settings: Any) -> RewardModel:
    return RewardModel("reward.models.rm", RewardModelConfig(path=str(rm_dir), **settings))


def tool_trajectory() -> Trajectory:
    """Policy ids of a two-turn tool trajectory (the agent loop's layout: a call and end of
    sequence, the tool's answer with mask 0, the final answer), read as the reward worker does."""
    policy = build_char_tokenizer()
    encode = lambda text: policy.encode(text, add_special_tokens=False)  # noqa: E731
    eos = policy.eos_token_id
    turns = [
        (encode(CALL) + [eos], 1),
        (encode("<tool_response>1023</tool_response>"), 0),
        (encode("1023") + [eos], 1),
    ]
    ids = [t for part, _ in turns for t in part]
    mask = [m for part, m in turns for _ in part]
    record = {
        "response_ids": ids,
        "response_mask": mask,
        "agent_turns": 2,
        "data_source": "arith/tool_sum",
        "ground_truth": "1023",
        "group_id": "g",
    }
    return TrajectoryReader(TransformersDecoder(policy)).trajectory(
        record, {"prompt": "345+678=", "data_source": "arith/tool_sum"}
    )


def test_a_tool_trajectory_reaches_the_reward_model_as_its_own_chat(rm_dir: Path) -> None:
    trajectory = tool_trajectory()
    assert trajectory.response == "1023"
    assert trajectory.messages == (
        Message("assistant", CALL),
        Message("tool", "1023"),
        Message("assistant", "1023"),
    )
    rm = load(rm_dir)
    tokenizer = rm.encoder.tokenizer
    encoded = rm.encoder.encode(trajectory)
    intended = (
        f"<|bos|><|user|>345+678=<|end|><|assistant|>{CALL}<|end|><|tool|>1023<|end|><|assistant|>1023<|end|>"
    )
    assert encoded.text == intended
    # the reward model reads exactly that: its byte-level ids decode back to it, with one BOS
    assert tokenizer.decode(encoded.ids, skip_special_tokens=False) == intended
    assert encoded.ids.count(tokenizer.bos_token_id) == 1 and encoded.ids[0] == tokenizer.bos_token_id
    # the tool's answer is its own message, between its role's token and the end of turn
    tool_at = encoded.ids.index(tokenizer.convert_tokens_to_ids("<|tool|>"))
    tool_end = encoded.ids.index(tokenizer.convert_tokens_to_ids("<|end|>"), tool_at)
    assert tokenizer.decode(encoded.ids[tool_at + 1 : tool_end]) == "1023"
    # re-encoded, not copied: the policy's ids for the same text are others
    assert encoded.ids != build_char_tokenizer().encode(intended, add_special_tokens=False)


def test_a_template_without_bos_gets_the_tokenizer_s_one(rm_dir: Path) -> None:
    no_bos = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    rm = load(rm_dir, chat_template=no_bos)
    ids = rm.encoder.encode(answer("3+4=", "7")).ids
    bos = rm.encoder.tokenizer.bos_token_id
    assert ids[0] == bos and ids.count(bos) == 1  # added by the tokenizer, once
    assert ids == load(rm_dir).encoder.encode(answer("3+4=", "7")).ids  # as the template that writes it


def test_a_long_trajectory_loses_the_left_of_its_prompt_only(rm_dir: Path) -> None:
    rm = load(rm_dir)
    short = rm.encoder.encode(answer("3+4=", "17")).ids
    long_prompt = "1+" * 40 + "3+4="
    encoder = ChatEncoder(rm.encoder.tokenizer, max_length=len(short) + 3)
    ids = encoder.encode(answer(long_prompt, "17")).ids
    assert len(ids) == len(short) + 3
    assert ids[:2] == short[:2]  # the BOS and the user's role token stay
    tokenizer = rm.encoder.tokenizer
    kept = tokenizer.decode(ids[2:], skip_special_tokens=False)
    kept_prompt, _, rest = kept.partition("<|end|>")
    assert rest == "<|assistant|>17<|end|>"  # the whole response stays
    assert long_prompt.endswith(kept_prompt) and 0 < len(kept_prompt) < len(long_prompt)  # the prompt's right end
    # a response alone past the limit keeps its end
    tight = ChatEncoder(tokenizer, max_length=8).encode(answer("3+4=", "123456789"))
    tail = tokenizer.decode(tight.ids[2:], skip_special_tokens=False)
    assert len(tight.ids) == 8 and tight.ids[:2] == short[:2]
    assert tight.text.endswith(tail) and tail.endswith("789<|end|>") and "3+4=" not in tail


def test_a_batch_scores_as_its_trajectories_one_by_one(rm_dir: Path) -> None:
    trajectories = [
        answer(f"{a}+{b}=", text, str(a + b))
        for a, b, text in [(3, 4, "7"), (9, 9, "118"), (0, 0, ""), (5, 5, "ab?"), (2, 7, "9")]
    ]
    trajectories.append(tool_trajectory())
    batched = load(rm_dir, batch_size=4).score_batch(trajectories)
    single = load(rm_dir, batch_size=1).score_batch(trajectories)
    for b, s in zip(batched, single, strict=True):
        assert math.isclose(b.sub_scores["rm_logit"], s.sub_scores["rm_logit"], rel_tol=1e-4, abs_tol=1e-5)
        assert b.score == b.sub_scores["rm_logit"]  # normalise: none
    assert len({round(r.score, 5) for r in batched}) > 1  # different inputs, different scores


def test_normalisation_of_the_logit(rm_dir: Path) -> None:
    trajectory = answer("3+4=", "7")
    logit = load(rm_dir).score_batch([trajectory])[0].score
    affine = load(rm_dir, normalise="affine", scale=2.0, shift=-1.0).score_batch([trajectory])[0]
    assert (
        math.isclose(affine.score, 2.0 * logit - 1.0, rel_tol=1e-6) and affine.sub_scores["rm_logit"] == logit
    )
    sigmoid = load(rm_dir, normalise="sigmoid", scale=0.5, shift=0.25).score_batch([trajectory])[0]
    assert math.isclose(sigmoid.score, 1.0 / (1.0 + math.exp(-(0.5 * logit + 0.25))), rel_tol=1e-9)
    rm = load(rm_dir, normalise="sigmoid")
    assert rm.score_of(0.0) == 0.5 and rm.score_of(-1e6) == 0.0 and rm.score_of(1e6) == 1.0  # no overflow


def test_sleep_drops_the_model_and_wake_up_brings_it_back(rm_dir: Path) -> None:
    rm = load(rm_dir)
    assert isinstance(rm, ModelReward) and RewardModelConfig.holds_model  # placed, and put to sleep when colocated
    before = rm.score_batch([answer("3+4=", "7")])
    rm.sleep()
    assert rm.asleep and rm.model is None
    rm.sleep()  # twice is harmless
    with pytest.raises(EngineStateError, match=r"reward.models.rm is asleep: wake_up\(\)"):
        rm.score_batch([answer("3+4=", "7")])
    rm.wake_up()
    assert not rm.asleep and rm.score_batch([answer("3+4=", "7")]) == before


class _OutOfMemory:
    def __call__(self, **_: Any) -> Any:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_a_batch_the_model_cannot_run_is_infra_not_zero(rm_dir: Path) -> None:
    rm = load(rm_dir, batch_size=2)
    good = rm.score_batch([answer("1+1=", "2")])[0]
    real_model = rm.model
    calls = iter([real_model, _OutOfMemory(), real_model])
    rm.model = type("Flaky", (), {"__call__": lambda self, **kw: next(calls)(**kw)})()
    results = rm.score_batch(
        [
            answer("1+1=", "2"),
            answer("1+1=", "3"),
            answer("2+2=", "4"),
            answer("2+2=", "5"),
            answer("1+1=", "2"),
        ]
    )
    assert [r.is_infra for r in results] == [False, False, True, True, False]
    assert all("out of memory" in r.reason and r.score == 0.0 for r in results[2:4])
    assert math.isclose(results[0].score, good.score, rel_tol=1e-5) and math.isclose(
        results[4].score, good.score, rel_tol=1e-5
    )


def test_a_trajectory_the_template_refuses_is_infra_alone(rm_dir: Path) -> None:
    strict = "{{ bos_token }}{% for m in messages %}{% if m['content'] == 'boom' %}{{ raise_exception('no') }}{% endif %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    results = load(rm_dir, chat_template=strict).score_batch([answer("1+1=", "2"), answer("1+1=", "boom")])
    assert not results[0].is_infra and results[1].is_infra and "chat template" in results[1].reason


def test_routed_by_data_source_with_the_rule_logged_beside(rm_dir: Path) -> None:
    config = RewardConfig.model_validate(
        {
            "models": {"my_rm": {"path": str(rm_dir), "log_rule": "arith"}},
            "by_data_source": {"arith": "my_rm"},
        }
    )
    router = RewardRouter(config)
    router.build_configured()
    results = router.score([answer("3+4=", "7"), answer("3+4=", "8")])
    assert [r.sub_scores["rule"] for r in results] == [1.0, 0.0]
    assert all(r.score == r.sub_scores["rm_logit"] for r in results)


def test_a_directory_that_is_no_reward_model_fails_clearly(tmp_path: Path) -> None:
    config = RewardConfig.model_validate({"models": {"my_rm": {"path": str(tmp_path / "missing")}}})
    with pytest.raises(RewardModelError, match=r"reward.models.my_rm.path: .*missing' is not a directory"):
        RewardRouter(config).reward("my_rm")
    with pytest.raises(
        FileNotFoundError,
        match=r"reward.models.my_rm.path .* does not exist: run `rl-train init-reward-model",
    ):
        check_reward_models(config.models)
    with pytest.raises(RewardModelError, match=r"has no config.json"):
        RewardModel("reward.models.x", RewardModelConfig(path=str(tmp_path)))
    causal_lm = tmp_path / "policy"  # a policy: transformers would load it with a random score head
    causal_lm.mkdir()
    (causal_lm / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}')
    with pytest.raises(
        RewardModelError,
        match=r"holds Qwen2ForCausalLM; a reward model is an AutoModelForSequenceClassification",
    ):
        check_reward_models({"x": RewardModelConfig(path=str(causal_lm))})
    planned = {"x": RewardModelConfig(path=str(tmp_path / "later"), create_task="single_digit_sum")}
    check_reward_models(planned)  # to be created before the run: no error


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ValidationError, match=r"models.my_rm.device"):
        RewardConfig.model_validate({"models": {"my_rm": {"path": "x", "device": "gpu0"}}})
    with pytest.raises(ValidationError, match=r"models.my_rm.batch_sise"):
        RewardConfig.model_validate({"models": {"my_rm": {"path": "x", "batch_sise": 4}}})
    with pytest.raises(ValidationError, match=r"models.my_rm.log_rule"):
        RewardConfig.model_validate({"models": {"my_rm": {"path": "x", "log_rule": "no_such_rule"}}})
    with pytest.raises(ValidationError, match=r"models.my_rm.create_task"):
        RewardConfig.model_validate({"models": {"my_rm": {"path": "x", "create_task": "tool_sum"}}})
    with pytest.raises(ValidationError, match=r"(?s)by_data_source.*unknown reward.*my_rm"):
        RewardConfig.model_validate(
            {"models": {"my_rm": {"path": "x"}}, "by_data_source": {"arith": "other_rm"}}
        )
    config = RewardConfig.model_validate(
        {"models": {"my_rm": {"path": "x"}}, "by_data_source": {"arith": "my_rm"}}
    )
    assert RewardRouter(config).route(SOURCE) == "my_rm"


def test_a_trajectory_without_messages_is_one_assistant_turn() -> None:
    bare = replace(answer("3+4=", "7"), messages=())
    assert bare.chat() == [{"role": "user", "content": "3+4="}, {"role": "assistant", "content": "7"}]
