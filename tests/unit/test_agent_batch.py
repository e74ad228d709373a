"""The agent loops as rollout runs them: many trajectories stepped together (one engine batch
per round, the round's tool calls side by side), which loop answers which prompt, the records
and the reward of a multi-turn trajectory, and the agent metrics."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from rl_train.config import ConfigError, load_config
from rl_train.engines.agent import tools
from rl_train.engines.agent.config import AgentConfig
from rl_train.engines.agent.loop import AgentLimits, ToolAgentLoop
from rl_train.engines.agent.metrics import agent_metrics, percentile
from rl_train.engines.agent.tools import Tool
from rl_train.engines.model.tokenizer import load_tokenizer
from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams
from rl_train.engines.workers.rollout_worker import agent_fields
from rl_train.registry import Registry

CALL = '<tool_call>{{"name":"{name}","arguments":{arguments}}}</tool_call>'


class BatchScript:
    """An engine answering each request id from its own script, turn after turn (EOS-ended)."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]]) -> None:
        self.tokenizer, self.scripts, self.version = tokenizer, {k: list(v) for k, v in scripts.items()}, 2
        self.batches: list[list[str]] = []

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        self.batches.append([r.request_id for r in requests])
        out = []
        for request in requests:
            script = self.scripts[request.request_id]
            text = script.pop(0) if script else "done"
            new = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
            out.append(
                GenerationResult(request.request_id, request.prompt_ids, [*request.response_prefix, *new],
                                 [-0.25] * len(new), [self.version] * len(new), "eos")  # fmt: skip
            )
        return out


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return load_tokenizer(tiny_model_dir)


def _with_tool(monkeypatch: pytest.MonkeyPatch, tool: Tool) -> None:
    """The tool table with ``tool`` added, for this test only (the table itself is fixed)."""
    table = {name: tools.TOOLS[name] for name in tools.TOOLS}
    monkeypatch.setattr(tools, "TOOLS", Registry("tool", tools.TOOLS.chosen_by, {**table, tool.name: tool}))


def _released_tool(monkeypatch: pytest.MonkeyPatch, name: str, why: str) -> threading.Event:
    """A tool ``name`` that answers "late" once the returned event is set (fails after 5 s: ``why``)."""
    released = threading.Event()

    def slow(arguments: dict, timeout_s: float, sandbox: object) -> str:
        assert released.wait(timeout=5), why
        return "late"

    _with_tool(monkeypatch, Tool(name, "answers when released", {"type": "object"}, slow))
    return released


def _calc(expression: str) -> str:
    return CALL.format(name="calculator", arguments=f'{{"expression":"{expression}"}}')


def test_each_round_is_one_engine_batch_of_the_trajectories_ready(tokenizer) -> None:
    engine = BatchScript(
        tokenizer,
        {"a": [_calc("1+2"), "3"], "b": ["9"], "c": [_calc("2*3"), _calc("6+1"), "7"]},
    )
    loop = ToolAgentLoop(engine, AgentLimits(max_turns=4, max_response_tokens=400))  # type: ignore[arg-type]
    prompt = [tokenizer.bos_token_id, *tokenizer.encode("x=", add_special_tokens=False)]
    out = loop.run_batch([("a", prompt), ("b", prompt), ("c", prompt)], SamplingParams())
    # The first round is one batch; later ones hold whoever's tool had answered by then (the two
    # calculator calls may answer together or one after the other).
    assert engine.batches[0] == ["a", "b", "c"]
    assert all(len(set(batch)) == len(batch) for batch in engine.batches)
    assert [sum(rid in batch for batch in engine.batches) for rid in "abc"] == [2, 1, 3]
    assert [t.turns for t in out] == [2, 1, 3] and [len(t.tool_calls) for t in out] == [1, 0, 2]
    for trajectory in out:
        assert len(trajectory.response_mask) == len(trajectory.response_ids) == len(trajectory.log_probs)
    texts = [tokenizer.decode(t.response_ids, skip_special_tokens=True) for t in out]
    assert "<tool_response>3</tool_response>3" in texts[0] and texts[1] == "9"
    assert "<tool_response>6</tool_response>" in texts[2] and "<tool_response>7</tool_response>7" in texts[2]


def test_a_slow_tool_holds_back_only_its_own_trajectory(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """b's tool answers only after a has had its second turn: a never waits for b's call."""
    released = _released_tool(monkeypatch, "test_slow", "a's second turn never came")

    class Releasing(BatchScript):
        def generate(self, requests, params):
            out = super().generate(requests, params)
            if len(self.batches) == 2:
                released.set()
            return out

    engine = Releasing(tokenizer, {"a": [_calc("1+2"), "3"], "b": [CALL.format(name="test_slow", arguments="{}"), "ok"]})
    loop = ToolAgentLoop(engine, AgentLimits(max_response_tokens=400, tool_timeout_s=10))  # type: ignore[arg-type]
    reported: list[tuple[str, bool]] = []  # (trajectory, whether b's slow tool had answered yet)
    out = loop.run_batch(
        [("a", [1]), ("b", [1])], SamplingParams(), on_done=lambda t: reported.append((t.request_id, len(engine.batches) > 2))
    )
    assert engine.batches == [["a", "b"], ["a"], ["b"]]
    assert [[c.error for c in t.tool_calls] for t in out] == [[False], [False]]
    # a is handed on as soon as it ends, before b's third engine batch; each is reported once
    assert reported == [("a", False), ("b", True)]


def test_simulated_tool_latency_is_per_trajectory_and_turn_and_times_out(tokenizer) -> None:
    limits = AgentLimits(max_response_tokens=400, tool_timeout_s=0.3, tool_latency_median_s=0.05, tool_latency_sigma=1.4)
    delays = {rid: limits.tool_delay(rid, 1) for rid in (f"p/{i}" for i in range(12))}
    assert delays == {rid: limits.tool_delay(rid, 1) for rid in delays}  # the same call waits the same time
    assert limits.tool_delay("p/0", 2) != delays["p/0"] and AgentLimits().tool_delay("p/0", 1) == 0.0
    slow = max(delays, key=delays.__getitem__)
    fast = min(delays, key=delays.__getitem__)
    assert delays[slow] > 0.3 > delays[fast]  # one past the time limit, one within it
    engine = BatchScript(tokenizer, {rid: [_calc("1+2"), "3"] for rid in (fast, slow)})
    out = ToolAgentLoop(engine, limits).run_batch([(fast, [1]), (slow, [1])], SamplingParams())  # type: ignore[arg-type]
    assert engine.batches == [[fast, slow], [fast], [slow]]  # the fast one never waits for the slow one
    assert [c.error for c in out[0].tool_calls] == [False] and out[0].tool_calls[0].seconds >= delays[fast]
    assert [c.error for c in out[1].tool_calls] == [True] and out[1].tool_calls[0].seconds >= 0.3
    assert "no answer within 0.3 s" in tokenizer.decode(out[1].response_ids, skip_special_tokens=True)


def test_stop_ends_the_trajectories_waiting_on_tools_as_aborted(tokenizer) -> None:
    stop = threading.Event()
    limits = AgentLimits(max_response_tokens=400, tool_timeout_s=30, tool_latency_median_s=20, tool_latency_sigma=0)
    engine = BatchScript(tokenizer, {"a": [_calc("1+2"), "3"], "b": ["9"]})
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    out = ToolAgentLoop(engine, limits).run_batch([("a", [1]), ("b", [1])], SamplingParams(), stop)  # type: ignore[arg-type]
    assert time.monotonic() - started < 5  # not the 20 s the call would take
    assert [t.stop_reason for t in out] == ["aborted", "eos"] and out[0].states[-1].value == "terminated"


class Pausing(BatchScript):
    """``a``'s first turn is cut by a pause half-way (the engine's abort while the loop's ``stop``
    is clear); the weights change meanwhile (version 2 -> 3)."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]]) -> None:
        super().__init__(tokenizer, scripts)
        self.prefixes: list[list[int]] = []

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        out = super().generate(requests, params)
        for i, request in enumerate(requests):
            if request.request_id == "a" and len(self.batches) == 1:  # cut after 5 tokens
                cut = len(request.response_prefix) + 5
                out[i] = GenerationResult("a", request.prompt_ids, out[i].response_ids[:cut], [-0.5] * 5, [2] * 5, "aborted")
                self.scripts["a"].insert(0, "")  # the rest of that turn comes next
                self.rest = out[i]
            elif request.request_id == "a" and len(self.batches) == 2:
                self.prefixes.append(list(request.response_prefix))
                whole = self.tokenizer.encode(_calc("1+2"), add_special_tokens=False)
                new = [*whole[5:], self.tokenizer.eos_token_id]
                out[i] = GenerationResult("a", request.prompt_ids, [*request.response_prefix, *new], [-0.25] * len(new), [3] * len(new), "eos")
        return out


def test_a_pause_keeps_the_cut_turn_and_continues_it(tokenizer) -> None:
    """An engine abort with ``stop`` clear is a pause (a weight push): the turn keeps its tokens
    and the next round continues it, and the tool call it makes is parsed across the cut; the
    trajectory waiting on its tool meanwhile (b) is not touched."""
    engine = Pausing(tokenizer, {"a": [_calc("1+2"), "3"], "b": [_calc("2*3"), "6"]})
    loop = ToolAgentLoop(engine, AgentLimits(max_response_tokens=400))  # type: ignore[arg-type]
    out = loop.run_batch([("a", [1]), ("b", [1])], SamplingParams(), threading.Event())
    a, b = out
    assert [t.stop_reason for t in out] == ["eos", "eos"]
    assert a.turns == 2 and [c.name for c in a.tool_calls] == ["calculator"] and not a.tool_calls[0].error
    assert engine.prefixes[0] == a.response_ids[:5]  # continued from its own five tokens
    assert a.token_versions[:5] == [2] * 5 and a.token_versions[5] == 3  # the cut turn spans two versions
    assert a.log_probs[:5] == [-0.5] * 5
    assert "<tool_response>3</tool_response>3" in tokenizer.decode(a.response_ids, skip_special_tokens=True)
    assert [s.value for s in a.states].count("generating") == 2  # one per turn, the cut one included
    assert b.turns == 2 and "<tool_response>6</tool_response>6" in tokenizer.decode(b.response_ids, skip_special_tokens=True)
    assert len(a.response_mask) == len(a.response_ids) == len(a.log_probs) == len(a.token_versions)


def test_with_stop_set_an_abort_ends_the_trajectory(tokenizer) -> None:
    """The same cut under a hold (``stop`` set): the trajectory ends ``aborted`` as it stands."""
    stop = threading.Event()

    class Holding(Pausing):
        def generate(self, requests, params):
            stop.set()
            return super().generate(requests, params)

    engine = Holding(tokenizer, {"a": [_calc("1+2"), "3"], "b": ["9"]})
    out = ToolAgentLoop(engine, AgentLimits(max_response_tokens=400)).run_batch([("a", [1]), ("b", [1])], SamplingParams(), stop)  # type: ignore[arg-type]
    assert [t.stop_reason for t in out] == ["aborted", "eos"] and len(out[0].response_ids) == 5
    assert len(engine.batches) == 1


def test_a_batch_takes_in_new_trajectories_while_its_tools_run(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """b is admitted while a waits on a slow tool, and runs (and ends) before a's tool answers."""
    released = _released_tool(monkeypatch, "test_slow_admit", "b never ran")
    engine = BatchScript(tokenizer, {"a": [CALL.format(name="test_slow_admit", arguments="{}"), "ok"], "b": ["9"]})
    queued = [[("b", [1])]]

    def admit() -> list[tuple[str, list[int]]]:
        return queued.pop() if queued and engine.batches else []  # once a has had its first turn

    def on_done(trajectory) -> None:
        if trajectory.request_id == "b":
            released.set()

    out = ToolAgentLoop(engine, AgentLimits(max_response_tokens=400, tool_timeout_s=10)).run_batch(  # type: ignore[arg-type]
        [("a", [1])], SamplingParams(), threading.Event(), on_done, admit
    )
    assert [t.request_id for t in out] == ["a", "b"] and [t.stop_reason for t in out] == ["eos", "eos"]
    assert engine.batches == [["a"], ["b"], ["a"]]
    assert out[0].tool_calls[0].name == "test_slow_admit" and not out[0].tool_calls[0].error


def test_the_tool_calls_of_a_round_run_side_by_side(tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two calls that each wait for the other: they only both answer if they run at once."""
    meeting = threading.Barrier(2)

    def meet(arguments: dict, timeout_s: float, sandbox: object) -> str:
        meeting.wait(timeout=5)
        return "met"

    _with_tool(monkeypatch, Tool("test_meet", "waits for a second caller", {"type": "object"}, meet))
    call = CALL.format(name="test_meet", arguments="{}")
    engine = BatchScript(tokenizer, {"a": [call, "ok"], "b": [call, "ok"]})
    loop = ToolAgentLoop(engine, AgentLimits(max_response_tokens=400, tool_timeout_s=10))  # type: ignore[arg-type]
    out = loop.run_batch([("a", [1]), ("b", [1])], SamplingParams())
    assert [[c.error for c in t.tool_calls] for t in out] == [[False], [False]]


def test_a_prompt_s_loop_is_its_column_then_its_data_source_then_the_default() -> None:
    cfg = AgentConfig(default="single_turn", by_data_source={"arith/tool": "tool_agent"})
    assert cfg.loop_for({"data_source": "arith/tool/hard"}) == "tool_agent"  # longest prefix
    assert cfg.loop_for({"data_source": "arith/plain"}) == "single_turn"
    assert cfg.loop_for({"data_source": "arith/plain", "agent_name": "tool_agent"}) == "tool_agent"


def test_an_unknown_loop_fails_at_load_naming_where() -> None:
    with pytest.raises(ConfigError, match=r"rollout.agent.default: unknown agent loop 'chatty'; available: gateway_agent, single_turn, tool_agent"):
        load_config(None, ["rollout.agent.default=chatty"])
    with pytest.raises(ConfigError, match=r"rollout.agent.by_data_source.*arith: unknown agent loop 'x'"):
        load_config(None, ['rollout.agent.by_data_source={"arith": "x"}'])


def test_a_multi_turn_record_is_scored_on_its_last_turn(tiny_model_dir: Path, tokenizer) -> None:
    from rl_train.engines.workers.reward_worker import RewardWorker

    engine = BatchScript(tokenizer, {"p/0": [_calc("12+30"), "42"]})
    trajectory = ToolAgentLoop(engine, AgentLimits(max_response_tokens=400)).run("p/0", [1], SamplingParams())  # type: ignore[arg-type]
    record = {"response_ids": trajectory.response_ids, **agent_fields(trajectory)}
    reader = RewardWorker(str(tiny_model_dir), tq=None)
    assert reader.response_text(record) == "42"
    assert record["agent_turns"] == 2 and record["tool_calls"][0][:2] == ["calculator", False]
    single = {"response_ids": tokenizer.encode("7", add_special_tokens=False) + [tokenizer.eos_token_id, 5]}
    assert reader.response_text(single) == "7"  # a single turn: everything up to end of sequence


def test_a_reward_sees_the_prompt_the_turns_the_tool_calls_and_the_row(tiny_model_dir: Path, tokenizer) -> None:
    """What the reward worker hands a reward of a multi-turn record, and what it writes back:
    an infra result is flagged, and the group filter then ignores that sample."""
    from rl_train.algorithms.group_filter import classify_groups
    from rl_train.engines.reward.base import RewardResult
    from rl_train.engines.workers.reward_worker import RewardWorker, result_fields

    engine = BatchScript(tokenizer, {"p/0": [_calc("12+30"), "42"]})
    trajectory = ToolAgentLoop(engine, AgentLimits(max_response_tokens=400)).run("p/0", [1], SamplingParams())  # type: ignore[arg-type]
    record = {"response_ids": trajectory.response_ids, **agent_fields(trajectory)}
    record.update(group_id="p", data_source="arith/tool_sum", ground_truth="42", stop_reason="stop")
    row = {"prompt": "12+30=", "data_source": "arith/tool_sum", "ground_truth": "42", "level": 2}
    worker = RewardWorker(str(tiny_model_dir), tq=None)
    seen = worker.reader.trajectory(record, row)
    assert (seen.prompt, seen.response, seen.ground_truth, seen.extra) == ("12+30=", "42", "42", {"level": 2})
    assert seen.turns == 2 and [(c.name, c.error) for c in seen.tool_calls] == [("calculator", False)]
    call = '<tool_call>{"name":"calculator","arguments":{"expression":"12+30"}}</tool_call>'
    assert seen.graded_text == call + "42"  # both turns, the model's tokens only
    assert seen.transcript == call + "<tool_response>42</tool_response>42"  # with the tool's answer
    (sample,) = worker.score_records([record], {"p": row})
    assert (sample.data_source, sample.result) == ("arith/tool_sum", RewardResult(1.0))
    assert result_fields(sample.result) == {"reward": 1.0, "is_infra": False}
    infra = result_fields(RewardResult.infra("sandbox did not start"))
    assert infra == {"reward": 0.0, "is_infra": True, "infra_reason": "sandbox did not start"}
    # Group p: 1.0, 0.0 and the infra sample: only two real scores, and they differ.
    written = [result_fields(RewardResult(1.0)), result_fields(RewardResult(1.0)), infra]
    verdict = classify_groups([w["reward"] for w in written], ["p"] * 3, [w["is_infra"] for w in written])
    assert verdict == {"p": False}  # read as a 0, the infra sample would have given the group a gradient


def test_agent_metrics_count_turns_calls_errors_and_latency() -> None:
    records = [
        {"agent_turns": 2, "tool_calls": [["calculator", False, 0.01]], "response_mask": [1, 1, 0, 0, 1]},
        {"agent_turns": 3, "tool_calls": [["calculator", True, 0.03], ["<malformed>", True, 0.0]], "response_mask": [1, 0]},
        {"response_ids": [1]},  # a single-turn record: not counted
    ]
    m = agent_metrics(records)
    assert m["agent/trajectories"] == 2 and m["agent/turns_mean"] == 2.5 and m["agent/tool_calls_mean"] == 1.5
    assert m["agent/tool_errors/calculator"] == 1 and m["agent/tool_errors/<malformed>"] == 1
    assert m["agent/tool_latency_p50_s"] == pytest.approx(0.01) and m["agent/tool_latency_p99_s"] == pytest.approx(0.03)
    assert m["agent/observation_token_frac"] == pytest.approx(3 / 7)
    assert agent_metrics([{"response_ids": [1]}]) == {}
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0 and percentile([5.0], 99) == 5.0


def test_an_evaluation_answers_each_prompt_with_its_loop(tiny_model_dir: Path, tokenizer) -> None:
    """rl-eval scores a tool task as the run's validation does: through the tool loop, on the
    last turn; a plain prompt of the same set still gets one generation."""
    from rl_train.engines.rollout.evaluation import PolicyEvaluator

    evaluator = PolicyEvaluator(tiny_model_dir, agent={"max_response_tokens": 400})
    script = {"0": [_calc("12+30"), "42"], "1": ["7"]}
    evaluator.engine = BatchScript(tokenizer, script)  # type: ignore[assignment]
    rows = [
        {"prompt": "12+30=", "data_source": "arith/tool_sum", "ground_truth": "42", "agent_name": "tool_agent"},
        {"prompt": "3+4=", "data_source": "arith/single_digit_sum", "ground_truth": "7"},
    ]
    answers = evaluator.answer(rows, SamplingParams())
    assert [(a.response, a.reward) for a in answers] == [("42", 1.0), ("7", 1.0)]
