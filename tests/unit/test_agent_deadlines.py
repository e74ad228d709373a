"""Gateway agents are bounded from outside: each has a deadline (its limit plus a grace) that
holds whether it sleeps, ignores SIGTERM or forks; the rollout's stop ends them at once; its key
and task never reach argv; and a failing agent costs its own prompt only, with no session left
open. Every test here reproduces one way an agent program could hang or leak and shows it fails."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_train.config import ConfigError, load_config
from rl_train.engines.agent import agent_threads, gateway_runs
from rl_train.engines.agent.chat import prompt_ids
from rl_train.engines.agent.config import AgentConfig
from rl_train.engines.agent.registry import FAILED
from rl_train.engines.model.tokenizer import build_char_tokenizer
from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams
from rl_train.engines.sandbox import SandboxUnavailable, sandbox_problem
from rl_train.engines.workers.rollout_batch import RolloutBatch

LIMIT_S = 1.0
SLACK_S = 2.5
"""Beyond the limit and its grace: a Python start and a reap on a loaded 2-core machine."""
CALL = '<tool_call>{"name":"calculator","arguments":{"expression":"12+30"}}</tool_call>'

AGENT = r"""
import json, os, signal, sys, time, urllib.error, urllib.request

def ask(content):
    body = json.dumps({"model": "rl-train-policy", "messages": [{"role": "user", "content": content}]}).encode()
    headers = {"authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "content-type": "application/json"}
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body, headers)
    try:
        return urllib.request.urlopen(request, timeout=30).status
    except urllib.error.HTTPError as error:
        return error.code

task = os.environ["RL_TRAIN_TASK"]
kind = task.split()[0]
if kind == "good":
    sys.exit(0 if ask(task) == 200 else 1)
if kind == "crash":
    sys.stderr.write("boom\n")
    sys.exit(3)
if kind == "sleep":  # 6 s, then a request
    time.sleep(6)
    ask(task)
if kind == "probe":  # reach a listener beside the gateway, and see the trainer's process
    import socket
    port, trainer = int(task.split()[1]), int(task.split()[2])
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        sys.exit(10)
    except OSError:
        pass
    try:
        os.kill(trainer, 0)
        sys.exit(11)
    except ProcessLookupError:
        pass
    sys.exit(0 if ask(task) == 200 else 1)
if kind in ("stubborn", "peek"):  # SIGTERM ignored; a stubborn one has two children, which ignore it too
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for _ in range(2 if kind == "stubborn" else 0):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    ask(task)  # the test's cue: everything is running
    time.sleep(60)
"""  # "silent": exits at once without a request. The program goes on argv: the sandbox hides /tmp


class Answering:
    """An engine whose every turn follows ``turns`` (then "done"), EOS-ended."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.tokenizer, self.turns, self.version = tokenizer, turns, 1
        self.served: set[str] = set()

    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        out = []
        for request in requests:
            self.served.add(request.request_id)
            turn = self.tokenizer.decode(request.response_prefix).count("</s>")
            text = self.turns[turn] if turn < len(self.turns) else "done"
            new = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
            out.append(GenerationResult(request.request_id, request.prompt_ids, [*request.response_prefix, *new], [-0.5] * len(new), [1] * len(new), "eos"))
        return out


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture
def engine(tokenizer) -> Iterator[Answering]:
    yield Answering(tokenizer, [CALL, "42"])
    gateway_runs.stop_gateways()


@pytest.fixture
def agent_cmd() -> list[str]:
    return [sys.executable, "-c", AGENT]


def _starts(tokenizer, tasks: list[str]) -> list[tuple[str, list[int]]]:
    return [(f"p{i}/0", prompt_ids(tokenizer, task)) for i, task in enumerate(tasks)]


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _tree(root: int) -> set[int]:
    """``root`` and every process descended from it, as this host's ``/proc`` shows them."""
    parents = {}
    for entry in Path("/proc").iterdir():
        try:
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError):
            continue
    found = {root}
    while more := {pid for pid, parent in parents.items() if parent in found} - found:
        found |= more
    return found


def _all_gone(pids: set[int], within_s: float = 5) -> bool:
    """Whether every one of ``pids`` has ended within ``within_s`` (a sandbox's processes die by
    their parent-death signal just after it; orphans are reaped by whoever inherits them)."""
    deadline = time.monotonic() + within_s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_alive(pid) for pid in pids)


class InBackground:
    """A batch run on a thread, its running agents visible to the test."""

    def __init__(self, engine, starts, cfg: AgentConfig, stop: threading.Event) -> None:
        self.engine, self.result, self.started = engine, [], time.monotonic()
        server = gateway_runs.gateway_for(engine)
        self.batch = gateway_runs.GatewayBatch(server, engine.tokenizer, SamplingParams(), cfg, stop)
        self.thread = threading.Thread(target=lambda: self.result.append(self.batch.run(starts)))
        self.thread.start()

    def processes_once_asked(self, rid: str, timeout_s: float = 30) -> set[int]:
        """The agent's processes (its sandbox's included), once it has sent its first request."""
        deadline = time.monotonic() + timeout_s
        while rid not in self.engine.served:
            assert time.monotonic() < deadline and self.thread.is_alive(), f"{rid} never asked"
            time.sleep(0.02)
        return _tree(self.batch.running[rid].agent.process.pid)


def _run(engine, starts, cfg: AgentConfig, stop: threading.Event | None = None) -> tuple[list, float]:
    started = time.monotonic()
    out = gateway_runs.run_gateway_agents(engine, starts, SamplingParams(), cfg, stop)
    return out, time.monotonic() - started


def _store(engine):
    return gateway_runs.gateway_for(engine).core.store


def test_the_default_agent_is_the_calculator_run_as_a_process(engine, tokenizer) -> None:
    cfg = AgentConfig()
    assert cfg.gateway_mode == "process" and cfg.gateway_command[1:] == ["-m", "rl_train.examples.calculator_agent"]
    [trajectory], _ = _run(engine, _starts(tokenizer, ["12+30="]), cfg)
    assert trajectory.stop_reason == "eos" and trajectory.turns == 2
    assert [c.name for c in trajectory.tool_calls] == ["calculator"]
    assert "<tool_response>42</tool_response>" in tokenizer.decode(trajectory.response_ids)
    assert len(_store(engine)) == 0


def test_a_sleeping_agent_process_is_killed_at_its_deadline(engine, tokenizer, agent_cmd) -> None:
    cfg = AgentConfig(gateway_command=agent_cmd, gateway_timeout_s=LIMIT_S)
    [trajectory], took = _run(engine, _starts(tokenizer, ["sleep 1+1="]), cfg)
    assert took < LIMIT_S + gateway_runs.GRACE_S + SLACK_S < 6  # not the agent's 6 s
    assert trajectory.stop_reason == FAILED and len(_store(engine)) == 0
    [again], _ = _run(engine, _starts(tokenizer, ["good 2+2="]), cfg)  # the gateway goes on serving
    assert again.stop_reason == "eos"


def test_an_agent_that_ignores_sigterm_and_forks_dies_as_a_group(engine, tokenizer, agent_cmd) -> None:
    limit_s = 3.0  # time to start, fork and ask on a loaded machine
    cfg = AgentConfig(gateway_command=agent_cmd, gateway_timeout_s=limit_s)
    run = InBackground(engine, _starts(tokenizer, ["stubborn"]), cfg, threading.Event())
    pids = run.processes_once_asked("p0/0")
    assert len(pids) >= 3  # the agent and its two children (and the sandbox's own, where there is one)
    run.thread.join(timeout=limit_s + gateway_runs.GRACE_S + SLACK_S)
    assert not run.thread.is_alive() and time.monotonic() - run.started < limit_s + gateway_runs.GRACE_S + SLACK_S
    assert run.result[0][0].stop_reason == FAILED
    assert _all_gone(pids)


def test_key_and_task_go_by_environment_never_argv_and_stop_ends_the_batch(
    engine, tokenizer, agent_cmd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "trainer-only-secret")
    cfg = AgentConfig(gateway_command=agent_cmd, gateway_timeout_s=60, tool_threads=2)
    stop = threading.Event()
    # two agents run (tool_threads), the third waits for a free slot
    run = InBackground(engine, _starts(tokenizer, ["peek 345+678=", "sleep 1+2=", "sleep 1+3="]), cfg, stop)
    pids = run.processes_once_asked("p0/0")
    key = _store(engine).token_of("p0/0").encode()
    told = []
    for pid in pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert key not in argv and b"345+678" not in argv, argv
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert not any(v.startswith(b"AWS_SECRET_ACCESS_KEY=") for v in environ)  # the trainer's stays its own
        told += [v for v in environ if v in (b"OPENAI_API_KEY=" + key, b"RL_TRAIN_TASK=peek 345+678=")]
    assert sorted(set(told)) == [b"OPENAI_API_KEY=" + key, b"RL_TRAIN_TASK=peek 345+678="]  # by environment
    stopped = time.monotonic()
    stop.set()
    run.thread.join(timeout=10)
    assert not run.thread.is_alive() and time.monotonic() - stopped < 5
    assert [t.stop_reason for t in run.result[0]] == ["aborted"] * 3
    assert _all_gone(pids) and len(_store(engine)) == 0


def test_an_agent_reaches_the_gateway_and_nothing_else(engine, tokenizer, agent_cmd) -> None:
    """Sandboxed, it cannot connect to another listener on the trainer's loopback, nor see the
    trainer's process; it still answers through the gateway."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    try:
        cfg = AgentConfig(gateway_command=agent_cmd, gateway_timeout_s=30)
        [trajectory], _ = _run(engine, _starts(tokenizer, [f"probe {listener.getsockname()[1]} {os.getpid()}"]), cfg)
        with pytest.raises(TimeoutError):
            listener.accept()[0].close()  # nobody came
    finally:
        listener.close()
    assert trajectory.stop_reason == "eos"  # exit 0: refused, the trainer unseen, and the gateway answered


def test_a_failing_agent_costs_only_its_own_prompt_and_no_session_leaks(engine, tokenizer, agent_cmd) -> None:
    limit_s = 2.5  # time for five sandboxes to start on a loaded machine; still short of the sleeper's 6 s
    cfg = AgentConfig(gateway_command=agent_cmd, gateway_timeout_s=limit_s)
    # the sleeper starts first: the batch ends with its deadline, whatever the others' starts cost
    starts = _starts(tokenizer, ["sleep 2+2=", "good 1+1=", "crash", "silent", "good 3+3="])
    trajectories, took = _run(engine, starts, cfg)
    assert took < limit_s + gateway_runs.GRACE_S + 2 < 6
    assert [t.stop_reason for t in trajectories] == [FAILED, "eos", FAILED, FAILED, "eos"]
    assert trajectories[1].response_ids and trajectories[4].response_ids
    assert len(_store(engine)) == 0
    # the rollout batch writes the good prompts and tags the failed ones for a retry or refill
    batch = RolloutBatch("train", n=1, with_tools=False)
    prompt = {"prompt": "x", "data_source": "arith", "ground_truth": "2"}
    batch.add_groups([f"p{i}" for i in range(5)], [prompt] * 5, ["gateway_agent"] * 5, [ids for _, ids in starts])
    batch.results = trajectories
    assert [t.request_id for t in batch.unwritten_results()] == ["p1/0", "p4/0"]
    tags = {f"p{i}/0": {"status": "eos"} for i in (1, 4)}
    unfinished, _, status = batch.final_tags({k: {"token_versions": [1]} for k in tags}, tags)
    assert unfinished == [] and {k: v["status"] for k, v in status.items()} == {
        "p0": "failure", "p1": "finished", "p2": "failure", "p3": "failure", "p4": "finished",
    }  # fmt: skip


SLOW_PROGRAM = '''
import threading, urllib.error, urllib.request

release, answers = threading.Event(), []

def run(base_url, api_key, task):
    release.wait(6)  # as if it slept 6 s
    request = urllib.request.Request(base_url + "/models", headers={"authorization": "Bearer " + api_key})
    try:
        answers.append(urllib.request.urlopen(request, timeout=10).status)
    except urllib.error.HTTPError as error:
        answers.append(error.code)
'''


def test_an_in_process_agent_is_abandoned_at_its_deadline_and_told_410(
    engine, tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "slow_agent_program.py").write_text(SLOW_PROGRAM)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(agent_threads, "MAX_STUCK_THREADS", 1)
    import slow_agent_program  # type: ignore[import-not-found]

    cfg = AgentConfig(gateway_mode="in_process", gateway_program="slow_agent_program:run", gateway_timeout_s=LIMIT_S)
    [trajectory], took = _run(engine, _starts(tokenizer, ["slow"]), cfg)
    assert took < LIMIT_S + SLACK_S and trajectory.stop_reason == FAILED
    assert len(_store(engine)) == 0 and agent_threads.stuck_threads() == 1
    # one stuck thread is the cap here: the next in-process agent is refused, and says why
    with caplog.at_level(logging.WARNING, logger=gateway_runs.__name__):
        [refused], _ = _run(engine, _starts(tokenizer, ["slow"]), cfg)
    assert refused.stop_reason == FAILED and "still running" in caplog.text
    slow_agent_program.release.set()
    deadline = time.monotonic() + 10
    while agent_threads.stuck_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert slow_agent_program.answers == [410]  # its request after the deadline: the session has ended
    assert agent_threads.stuck_threads() == 0
    good = AgentConfig(gateway_mode="in_process", gateway_program="rl_train.examples.calculator_agent:run")
    [solved], _ = _run(engine, _starts(tokenizer, ["12+30="]), good)  # no longer refused
    assert solved.stop_reason == "eos" and solved.turns == 2


def test_stop_ends_in_process_agents_at_once(engine, tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "stopped_agent_program.py").write_text(SLOW_PROGRAM)
    monkeypatch.syspath_prepend(str(tmp_path))
    import stopped_agent_program  # type: ignore[import-not-found]

    cfg = AgentConfig(gateway_mode="in_process", gateway_program="stopped_agent_program:run", gateway_timeout_s=60)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    trajectories, took = _run(engine, _starts(tokenizer, ["a", "b"]), cfg, stop)
    assert took < SLACK_S and [t.stop_reason for t in trajectories] == ["aborted", "aborted"]
    assert len(_store(engine)) == 0
    stopped_agent_program.release.set()
    deadline = time.monotonic() + 10
    while len(stopped_agent_program.answers) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stopped_agent_program.answers == [410, 410]


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A host where bubblewrap is not found."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    sandbox_problem.cache_clear()
    yield
    sandbox_problem.cache_clear()


def test_without_a_sandbox_agent_processes_are_refused_unless_allowed(
    engine, tokenizer, agent_cmd, no_bwrap: None, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = AgentConfig(gateway_command=agent_cmd, gateway_timeout_s=30)
    with pytest.raises(SandboxUnavailable, match=r"sandbox\.allow_unsandboxed: true"):
        _run(engine, _starts(tokenizer, ["good 1+1="]), cfg)
    assert len(_store(engine)) == 0  # the session opened for it is closed
    with caplog.at_level(logging.WARNING):
        [trajectory], _ = _run(engine, _starts(tokenizer, ["good 1+1="]), cfg.with_sandbox({"allow_unsandboxed": True}))
    assert trajectory.stop_reason == "eos" and "WITHOUT a sandbox" in caplog.text


def test_in_process_gateway_agents_need_no_sandbox_at_start(tmp_path: Path, no_bwrap: None) -> None:
    from rl_train.cli import check_inputs

    overrides = [f"run.output_dir={tmp_path / 'runs'}", f"data.data_dir={tmp_path / 'data'}", "rollout.agent.default=gateway_agent"]
    with pytest.raises(SandboxUnavailable, match=r"rollout\.agent\.gateway_command"):
        check_inputs(load_config(None, overrides))  # the default: the calculator agent as a process
    in_process = ["rollout.agent.gateway_mode=in_process", "rollout.agent.gateway_program=rl_train.examples.calculator_agent:run"]
    check_inputs(load_config(None, [*overrides, *in_process]))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            'rollout.agent.gateway_command=["my-agent", "--key", "{api_key}"]',
            r"rollout.agent.gateway_command: \[2\]: got '\{api_key\}'; .*OPENAI_API_KEY.*never argv",
        ),
        (
            "rollout.agent.gateway_program=my_agent:run",
            r"rollout.agent: gateway_program: got 'my_agent:run' with gateway_mode: process; an in-process agent is an explicit opt-in",
        ),
        ("rollout.agent.gateway_mode=in_process", r"rollout.agent: gateway_program: got ''; gateway_mode: in_process needs a module:function"),
        ("rollout.agent.gateway_mode=thread", r"rollout.agent.gateway_mode: got 'thread'"),
        ("rollout.agent.gateway_command=[]", r"rollout.agent.gateway_command: empty"),
    ],
)
def test_inconsistent_agent_config_fails_at_load(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_in_process_with_a_command_fails_at_load() -> None:
    with pytest.raises(ConfigError, match=r"rollout.agent: gateway_command: got \['a'\] with gateway_mode: in_process"):
        load_config(None, ["rollout.agent.gateway_mode=in_process", "rollout.agent.gateway_program=m:f", 'rollout.agent.gateway_command=["a"]'])
    assert os.environ.get("RL_TRAIN_TASK") is None  # nothing of an agent's leaks into the trainer


def test_every_gateway_mode_the_config_allows_has_an_entry_and_only_process_runs_untrusted_code() -> None:
    """The modes are a table (``GATEWAY_MODES``): the config's choices are its names, and what a
    mode is (whether its agent is a program nobody vetted) is read from its entry."""
    from rl_train.engines.agent.gateway_modes import GATEWAY_MODES

    assert [AgentConfig(gateway_mode=m, gateway_program="" if GATEWAY_MODES[m].runs_untrusted_program else "m:f").gateway_mode for m in GATEWAY_MODES] == list(GATEWAY_MODES)
    assert [m for m in GATEWAY_MODES if GATEWAY_MODES[m].runs_untrusted_program] == ["process"]
    for mode in GATEWAY_MODES:
        assert callable(GATEWAY_MODES.get(mode))
