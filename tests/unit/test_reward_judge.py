"""The generative judge (engines/reward/judge.py, judge_config.py): its verdict parsers, the one
retry of an unparseable verdict and then is_infra (counted by the reward metrics through the
router), a timeout as is_infra, batching equal to one by one, and the sleep contract.

The real tiny model decodes wherever the test is about the judge's use of an engine; where the
test needs verdicts of its own choosing (a retry that succeeds, a decode that hangs) a scripted
engine answers with the real tokenizer: the engine is the edge here, the judge is under test.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rl_train.config import load_config
from rl_train.engines.model.tokenizer import load_tokenizer
from rl_train.engines.reward.base import ModelReward, RewardResult, Trajectory
from rl_train.engines.reward.config import RewardConfig
from rl_train.engines.reward.judge import GenerativeJudge, VerdictParser
from rl_train.engines.reward.judge_config import DEFAULT_TEMPLATE, JudgeConfig, VerdictParserConfig
from rl_train.engines.reward.metrics import INFRA_FAILURES, ScoredSample, reward_metrics
from rl_train.engines.reward.router import RewardRouter
from rl_train.engines.rollout.protocol import (
    EngineStateError,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
)

REPO = Path(__file__).resolve().parents[2]
DIGITS_TEMPLATE = "{response}={ground_truth}?"
"""A template on which the tiny model's greedy verdicts all start with a digit (checked below)."""


def sums(n: int) -> list[Trajectory]:
    pairs = [(1, 2), (3, 4), (5, 5), (9, 8), (0, 0), (7, 1), (6, 2), (4, 4)][:n]
    return [
        Trajectory.of_answer({"prompt": f"{a}+{b}=", "data_source": "arith/sum", "ground_truth": str(a + b)}, str(a + b + i % 2))
        for i, (a, b) in enumerate(pairs)
    ]


# -- the parsers ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7", (0.7, 7.0)),
        ("Score: 10/10", (1.0, 10.0)),  # the first number
        (" 7.5 because", (0.75, 7.5)),
        ("0", (0.0, 0.0)),
        ("11", None),  # off the 0..10 scale
        ("-1", None),
        ("", None),
        ("no idea", None),
    ],
)
def test_the_default_parser_reads_the_first_number_on_a_0_to_10_scale(text: str, expected: tuple[float, float] | None) -> None:
    verdict = VerdictParser(VerdictParserConfig()).parse(text)
    assert (None if verdict is None else (verdict.score, verdict.raw)) == expected


def test_a_number_parser_takes_its_pattern_and_scale() -> None:
    parser = VerdictParser(VerdictParserConfig(pattern=r"grade=(\d+)", scale=(1, 5)))
    assert parser.parse("3 then grade=4").score == 0.75  # type: ignore[union-attr]  # (4 - 1) / (5 - 1)
    assert parser.parse("grade=1").score == 0.0  # type: ignore[union-attr]
    assert parser.parse("grade=0") is None and parser.parse("3") is None


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("Incorrect.", 0.0),  # whole words: not 'correct'
        ("YES it is", 1.0),  # case-insensitive
        ("no, yes", 0.0),  # the earliest word wins
        ("I'd say correct", 1.0),
        ("yesterday", None),
        ("nope", None),
    ],
)
def test_a_words_parser_reads_the_earliest_whole_word(text: str, score: float | None) -> None:
    parser = VerdictParser(VerdictParserConfig(kind="words", words={"yes": 1.0, "no": 0.0, "correct": 1.0, "incorrect": 0.0}))
    verdict = parser.parse(text)
    assert (None if verdict is None else verdict.score) == score
    if verdict is not None:
        assert verdict.raw == verdict.score


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"template": "{answer} is it"}, "judges.j.template.*unknown placeholders \\['answer'\\]"),
        ({"template": "no placeholder"}, "judges.j.template.*no placeholder"),
        ({"template": "{response"}, "judges.j.template.*not a template"),
        ({"parser": {"pattern": "\\d+"}}, "judges.j.parser.pattern.*needs a group"),
        ({"parser": {"scale": [5, 5]}}, "judges.j.parser.*high must be above low"),
        ({"parser": {"kind": "words"}}, "judges.j.parser.*at least one word"),
        ({"engine": "nope"}, "judges.j.engine"),
    ],
)
def test_a_bad_judge_section_fails_at_load_naming_its_field(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=f"(?s){message}"):
        RewardConfig.model_validate({"judges": {"j": {"model_path": "m", **section}}})


def test_a_judge_is_routed_by_its_name_and_the_default_template_is_the_documented_one() -> None:
    config = RewardConfig.model_validate({"judges": {"j": {"model_path": "m"}}, "by_data_source": {"arith": "j"}})
    assert RewardRouter(config).route("arith/sum") == "j"
    assert "Score: " in DEFAULT_TEMPLATE and JudgeConfig(model_path="m").template == DEFAULT_TEMPLATE
    import rl_train.engines.reward.judge as judge_module

    assert all(line.strip() in judge_module.__doc__ for line in DEFAULT_TEMPLATE.splitlines())  # type: ignore[operator]
    with pytest.raises(ValidationError, match="may not contain ':' nor be a registered"):
        RewardConfig.model_validate({"judges": {"exact": {"model_path": "m"}}})
    demo = load_config(str(REPO / "configs" / "arith-judge-tiny.yaml"))
    assert demo.reward.by_data_source == {"arith": "judge"} and demo.reward.judges["judge"].model_path == str(demo.model.path)


# -- a scripted engine: verdicts of the test's choosing, through the real tokenizer ---------------
class ScriptedEngine:
    """Answers each call with the next list of verdict texts; ``delay_s`` makes a call hang until
    aborted (or the delay passes)."""

    def __init__(self, model_dir: Path, script: list[list[str]], delay_s: float = 0.0) -> None:
        self.tokenizer = load_tokenizer(model_dir)
        self.script = list(script)
        self.delay_s = delay_s
        self.calls: list[tuple[int, float]] = []  # (requests, temperature) per call
        self.aborted = threading.Event()
        self.asleep = False

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        if self.asleep:
            raise EngineStateError("asleep")
        self.calls.append((len(requests), params.temperature))
        stopped = self.aborted.wait(self.delay_s) if self.delay_s else False
        texts = self.script.pop(0) if self.script else [""] * len(requests)
        eos = self.tokenizer.eos_token_id
        return [
            GenerationResult(r.request_id, r.prompt_ids, [*self.tokenizer.encode(t, add_special_tokens=False), eos], [], [], "aborted" if stopped else "eos")
            for r, t in zip(requests, texts, strict=True)
        ]

    def abort(self) -> int:
        self.aborted.set()
        return 1

    def sleep(self) -> None:
        self.asleep = True

    def wake_up(self) -> None:
        self.asleep = False

    def close(self) -> None:
        pass


def scripted_judge(model_dir: Path, script: list[list[str]], delay_s: float = 0.0, **config: Any) -> tuple[GenerativeJudge, ScriptedEngine]:
    engine = ScriptedEngine(model_dir, script, delay_s)
    return GenerativeJudge("j", JudgeConfig(model_path=str(model_dir), **config), engine), engine  # type: ignore[arg-type]


def test_an_unparseable_verdict_is_sampled_once_more_fresh_and_only_it(tiny_model_dir: Path) -> None:
    judge, engine = scripted_judge(tiny_model_dir, [["8", "hmm", "10"], ["6"]], retry_temperature=0.7)
    results = judge.score_batch(sums(3))
    assert engine.calls == [(3, 0.0), (1, 0.7)]  # one call for the batch, one for its one retry
    assert results == [
        RewardResult(0.8, {"judge_raw": 8.0, "judge_retried": 0.0}),
        RewardResult(0.6, {"judge_raw": 6.0, "judge_retried": 1.0}),
        RewardResult(1.0, {"judge_raw": 10.0, "judge_retried": 0.0}),
    ]


def test_a_verdict_unparseable_twice_is_infra_and_counted_through_the_router(tiny_model_dir: Path) -> None:
    """The real engine and the tiny model: no verdict holds the word, so each is sampled twice
    (two engine calls per scoring), then is infra; the router scores infra once more
    (max_infra_retries 1) and the metrics count every sample."""
    reward = RewardConfig.model_validate(
        {
            "judges": {"j": {"model_path": str(tiny_model_dir), "parser": {"kind": "words", "words": {"zebra": 1.0}}, "max_new_tokens": 3}},
            "by_data_source": {"arith": "j"},
            "max_infra_retries": 1,
        }
    )
    router = RewardRouter(reward)
    judge = router.reward("j")
    assert isinstance(judge, GenerativeJudge)
    calls: list[int] = []
    generate = judge.engine.generate

    def counted(requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        calls.append(len(requests))
        return generate(requests, params)

    judge.engine.generate = counted  # type: ignore[method-assign]
    trajectories = sums(4)
    results = router.score(trajectories)
    assert calls == [4, 4, 4, 4]  # (batch, retry) x (the first scoring, the router's retry)
    assert all(r.is_infra and r.reason.startswith("unparseable verdict: ") for r in results), results
    metrics = reward_metrics([ScoredSample(t.data_source, r) for t, r in zip(trajectories, results, strict=True)])
    assert metrics[INFRA_FAILURES] == 4.0 and metrics[f"{INFRA_FAILURES}/arith/sum"] == 4.0
    assert metrics["reward/mean"] == 0.0 and not any(k.startswith("reward/arith/sum/") for k in metrics)


def test_a_judge_past_its_timeout_is_infra_within_the_limit_and_aborted(tiny_model_dir: Path) -> None:
    judge, engine = scripted_judge(tiny_model_dir, [["9", "9"], ["5", "5"]], delay_s=30.0, timeout_s=0.3)
    started = time.monotonic()
    results = judge.score_batch(sums(2))
    assert time.monotonic() - started < 0.3 + 5.0  # the limit plus a loaded machine's grace
    assert engine.aborted.is_set()
    assert all(r.is_infra and "timed out" in r.reason for r in results), results
    engine.delay_s = 0.0  # the aborted call has returned (or returns at once): the next one runs
    assert [r.score for r in judge.score_batch(sums(2))] == [0.5, 0.5]


def test_an_aborted_decode_is_infra_not_a_verdict(tiny_model_dir: Path) -> None:
    judge, engine = scripted_judge(tiny_model_dir, [["9"]], delay_s=5.0, timeout_s=30.0)
    threading.Timer(0.2, engine.abort).start()  # as a sleep from another thread would
    [result] = judge.score_batch(sums(1))
    assert result.is_infra and "aborted" in result.reason


def test_the_batch_decodes_as_one_call_and_scores_as_one_by_one(tiny_model_dir: Path) -> None:
    config = JudgeConfig(model_path=str(tiny_model_dir), template=DIGITS_TEMPLATE, parser={"pattern": r"^(\d)", "scale": (0, 9)}, max_new_tokens=4, seed=3)
    judge = GenerativeJudge.load("j", config)
    calls: list[int] = []
    generate = judge.engine.generate

    def counted(requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        calls.append(len(requests))
        return generate(requests, params)

    judge.engine.generate = counted  # type: ignore[method-assign]
    trajectories = sums(8)  # prompts of different lengths: the batch is left-padded
    batched = judge.score_batch(trajectories)
    assert calls == [8]  # every verdict parsed: one call, no retry
    alone = [judge.score_batch([t])[0] for t in trajectories]
    assert batched == alone and not any(r.is_infra for r in batched)
    assert all(r.sub_scores["judge_retried"] == 0.0 for r in batched)


def test_the_judge_sleeps_and_wakes_with_its_engine(tiny_model_dir: Path) -> None:
    judge = GenerativeJudge.load("j", JudgeConfig(model_path=str(tiny_model_dir), max_new_tokens=2))
    assert isinstance(judge, ModelReward) and JudgeConfig.holds_model  # placed, and put to sleep when colocated
    judge.sleep()
    with pytest.raises(EngineStateError, match="asleep"):
        judge.score_batch(sums(1))
    judge.wake_up()
    assert len(judge.score_batch(sums(2))) == 2
    judge.close()
