"""A generative judge (R-6.1, R-6.5): a model decodes a verdict on each trajectory, a parser
turns it into a score.

The judge is an entry of ``reward.judges`` (``judge_config.JudgeConfig``), routed by name like
any reward. It has a rollout engine of its own (``reward.judges.<name>.engine``, the built-in
torch engine by default, from ``ROLLOUT_ENGINES``), loaded from its ``model_path`` in the
worker that scores with it; the policy's own model path may serve, read as it was on disk.

The prompt. Each trajectory fills the template's placeholders: ``{prompt}`` (the row's
prompt), ``{response}`` (the answer graded: the last turn of a multi-turn trajectory),
``{ground_truth}`` and ``{transcript}`` (the whole response, tools' answers included). The
text is encoded as a rollout prompt is (BOS where the tokenizer has one, then the text), so a
chat model's markup is written into the template itself. The default template::

    You are grading an answer to a question.
    Question: {prompt}
    Reference answer: {ground_truth}
    Answer to grade: {response}
    Rate the answer from 0 (wrong) to 10 (right and complete). Reply with the number only.
    Score:

(with a blank after ``Score:``). The verdict is what the judge writes up to end of sequence
or ``max_new_tokens``.

The parser (``parser``). ``number`` (the default): the first match of ``pattern`` in the
verdict, whose first group is a number n on ``scale`` [low, high]; the score is
(n - low) / (high - low), 0..1; a number outside the scale is unparseable. ``words``: the
earliest of the configured words in the verdict (whole words, case-insensitive) gives its
score. Sub-scores: ``judge_raw`` (the number read, or the word's score) and ``judge_retried``
(1 when the verdict came from the retry).

Failures are infra, never a score (R-6.5). The whole batch is decoded in one engine call;
the verdicts that cannot be parsed are sampled once more together, at ``retry_temperature``
(a greedy retry would repeat them), and one still unparseable is
``RewardResult.infra("unparseable verdict: ...")``. A decode call past ``timeout_s`` is aborted
and its samples are infra; the engine finishes the aborted call at its next token, and the next
call waits for it (up to ``timeout_s``) before it starts, since the engine takes one call at a
time. The router then retries infra samples (``reward.max_infra_retries``).

Sleep contract: ``sleep`` / ``wake_up`` are the engine's (R-6.8): asleep, the judge frees its
KV cache and moves its weights off the accelerator, and scoring before ``wake_up`` is an
error (``EngineStateError``), a bug of the caller.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from rl_train.engines.reward.base import RewardResult, Trajectory
from rl_train.engines.reward.judge_config import JudgeConfig, VerdictParserConfig
from rl_train.engines.rollout.protocol import GenerationRequest, RolloutEngine, SamplingParams
from rl_train.engines.rollout.registry import build_rollout_engine

SHOWN_CHARS = 120
"""How much of an unparseable verdict its infra reason quotes."""


@dataclass(frozen=True)
class Verdict:
    """A parsed verdict: its score (0..1 on a number scale, the word's on a words parser) and
    what was read (``judge_raw``)."""

    score: float
    raw: float


class VerdictParser:
    """A verdict's text -> ``Verdict``, or None when it cannot be read (see the module docstring)."""

    def __init__(self, config: VerdictParserConfig) -> None:
        self.config = config
        self.pattern = re.compile(config.pattern)
        words = sorted(config.words, key=len, reverse=True)  # a longer word first where one contains another
        self.words = re.compile(r"\b(" + "|".join(re.escape(w) for w in words) + r")\b", re.IGNORECASE) if words else None
        self.scores = {w.lower(): s for w, s in config.words.items()}

    def parse(self, text: str) -> Verdict | None:
        if self.config.kind == "words":
            return self._word(text)
        return self._number(text)

    def _number(self, text: str) -> Verdict | None:
        match = self.pattern.search(text)
        if match is None or match.group(1) is None:
            return None
        try:
            raw = float(match.group(1))
        except ValueError:
            return None
        low, high = self.config.scale
        if not low <= raw <= high:  # NaN and inf fail here too
            return None
        return Verdict((raw - low) / (high - low), raw)

    def _word(self, text: str) -> Verdict | None:
        match = self.words.search(text) if self.words is not None else None
        if match is None:
            return None
        score = self.scores[match.group(1).lower()]
        return Verdict(score, score)


class GenerativeJudge:
    """A ``BatchReward``: one engine call per batch (and one for its retries)."""

    def __init__(self, name: str, config: JudgeConfig, engine: RolloutEngine) -> None:
        self.name = name
        self.config = config
        self.engine = engine
        self.device: str = config.device
        """Where the judge's engine is (a ``ModelReward``: placed, and colocated put to sleep, by the worker)."""
        self.parser = VerdictParser(config.parser)
        tokenizer = engine.tokenizer
        self._bos = [int(tokenizer.bos_token_id)] if tokenizer.bos_token_id is not None else []
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"judge-{name}")
        """Runs each decode call, so that the caller can stop waiting at ``timeout_s``."""
        self._abandoned: Future[Any] | None = None
        """A call given up at its timeout and aborted, until it has returned."""
        self._calls = 0

    @classmethod
    def load(cls, name: str, config: JudgeConfig) -> GenerativeJudge:
        engine = build_rollout_engine(config.engine, config.model_path, seed=config.seed, device=config.device)
        return cls(name, config, engine)

    # -- scoring ------------------------------------------------------------------------
    def score_batch(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        """One result per trajectory, in order (see the module docstring)."""
        prompts = [self.prompt_ids(t) for t in trajectories]
        first = self.decode(prompts, self.config.temperature)
        if isinstance(first, str):
            return [RewardResult.infra(first) for _ in trajectories]
        verdicts = [self.parser.parse(text) for text in first]
        again = [i for i, v in enumerate(verdicts) if v is None]
        second: list[str] | str = self.decode([prompts[i] for i in again], self.config.retry_temperature) if again else []
        results = [self._result(v, retried=False) if v is not None else None for v in verdicts]
        for k, i in enumerate(again):
            if isinstance(second, str):
                results[i] = RewardResult.infra(f"{second} (the retry of an unparseable verdict {_shown(first[i])})")
                continue
            verdict = self.parser.parse(second[k])
            results[i] = (
                self._result(verdict, retried=True)
                if verdict is not None
                else RewardResult.infra(f"unparseable verdict: {_shown(first[i])}, then {_shown(second[k])}")
            )
        return [r for r in results if r is not None]

    @staticmethod
    def _result(verdict: Verdict, retried: bool) -> RewardResult:
        return RewardResult(verdict.score, {"judge_raw": verdict.raw, "judge_retried": float(retried)})

    def prompt_text(self, trajectory: Trajectory) -> str:
        """The template filled with ``trajectory`` (its values are inserted as they are: braces
        in them are text)."""
        return self.config.template.format_map(
            {
                "prompt": trajectory.prompt,
                "response": trajectory.response,
                "ground_truth": trajectory.ground_truth,
                "transcript": trajectory.transcript,
            }
        )

    def prompt_ids(self, trajectory: Trajectory) -> list[int]:
        """BOS (where the tokenizer has one), then the filled template: a rollout prompt's encoding."""
        return [*self._bos, *self.engine.tokenizer.encode(self.prompt_text(trajectory), add_special_tokens=False)]

    def decode(self, prompts: list[list[int]], temperature: float) -> list[str] | str:
        """The verdict on each prompt from one engine call, or the reason there is none (a
        timeout, an aborted decode)."""
        timeout = self.config.timeout_s
        if not self._settled():
            return f"judge {self.name!r}: still finishing a decode aborted at its {timeout:g} s limit"
        self._calls += 1
        requests = [GenerationRequest(f"judge-{self._calls}-{i}", ids) for i, ids in enumerate(prompts)]
        params = SamplingParams(temperature=temperature, max_new_tokens=self.config.max_new_tokens)
        future = self._executor.submit(self.engine.generate, requests, params)
        try:
            results = future.result(timeout=timeout)
        except FutureTimeout:
            self.engine.abort()
            self._abandoned = future
            return f"judge {self.name!r} timed out: no verdict within {timeout:g} s"
        if any(r.stop_reason == "aborted" for r in results):
            return f"judge {self.name!r}: its decode was aborted (the engine was put to sleep or synced meanwhile)"
        tokenizer = self.engine.tokenizer
        eos = tokenizer.eos_token_id
        return [str(tokenizer.decode([t for t in r.response_ids if t != eos], skip_special_tokens=True)) for r in results]

    def _settled(self) -> bool:
        """Whether the engine is free: a call abandoned at its timeout has returned (waiting up
        to ``timeout_s`` for it)."""
        if self._abandoned is None:
            return True
        try:
            self._abandoned.exception(timeout=self.config.timeout_s)  # its result or error is no one's
        except FutureTimeout:
            return False
        self._abandoned = None
        return True

    # -- lifecycle (R-6.8) ----------------------------------------------------------------
    def sleep(self) -> None:
        """Free the judge's KV cache and move its weights off the accelerator until ``wake_up``."""
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def close(self) -> None:
        self.engine.abort()
        self._executor.shutdown(wait=True)
        self.engine.close()


def _shown(verdict: str) -> str:
    return repr(verdict if len(verdict) <= SHOWN_CHARS else verdict[:SHOWN_CHARS] + "...")
