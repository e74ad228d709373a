"""A policy's answers to a set of prompts, scored, in this process (R-10.1).

Evaluating a saved checkpoint needs no Ray pool: one rollout engine (built from the registry,
as a rollout replica builds its own) answers every prompt, and each answer is scored exactly
as the run's reward workers score a trajectory: ``TrajectoryReader`` reads the graded
response up to end of sequence and the run's ``RewardRouter`` picks the reward by the row's
``data_source``. So an evaluation of checkpoint k at the run's validation temperature scores
what the run's own validation at step k scored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_train.engines.model.response_decoder import load_response_decoder
from rl_train.engines.reward.config import RewardConfig
from rl_train.engines.reward.router import RewardRouter
from rl_train.engines.reward.trajectory import TrajectoryReader
from rl_train.engines.rollout.protocol import RolloutEngine, SamplingParams
from rl_train.engines.rollout.registry import build_rollout_engine
from rl_train.engines.sandbox import SandboxConfig


@dataclass(frozen=True)
class ScoredAnswer:
    """One answer to one prompt, and its reward."""

    prompt_index: int
    """The prompt's row in the dataset (its ``n`` answers share it)."""
    prompt: str
    response: str
    ground_truth: str
    reward: float
    stop_reason: str


class PolicyEvaluator:
    """The rollout engine of one HF policy directory and the reward workers' scoring."""

    def __init__(
        self,
        policy_dir: str | Path,
        engine: str = "torch",
        seed: int = 0,
        agent: dict[str, Any] | None = None,
        sandbox: dict[str, Any] | None = None,
        reward: dict[str, Any] | None = None,
    ) -> None:
        """``agent``: the run's ``rollout.agent``, so that each prompt is answered by its loop;
        ``sandbox``: the run's ``sandbox``, how its tools (and the code_tests reward) run
        untrusted code; ``reward``: the run's ``reward``, which reward scores each data_source."""
        from rl_train.engines.agent.config import AgentConfig

        self.engine: RolloutEngine = build_rollout_engine(engine, policy_dir, seed=seed)
        self.agent = AgentConfig.model_validate(agent or {}).with_sandbox(sandbox)
        self.reader = TrajectoryReader(load_response_decoder(str(policy_dir)))
        self.router = RewardRouter(RewardConfig.model_validate(reward or {}), SandboxConfig.model_validate(sandbox or {}))

    def encode_prompt(self, text: str) -> list[int]:
        """BOS then the text, as a rollout replica encodes a prompt (``RolloutWorker.encode_prompt``)."""
        tokenizer = self.engine.tokenizer
        return [tokenizer.bos_token_id, *tokenizer.encode(text, add_special_tokens=False)]

    def answer(self, prompts: list[dict[str, Any]], params: SamplingParams, n: int = 1) -> list[ScoredAnswer]:
        """``n`` answers to each row of ``prompts`` (``prompt``, ``data_source``, ``ground_truth``),
        prompt-major, each scored by the grader its ``data_source`` routes to."""
        from rl_train.engines.agent.registry import AGENT_LOOPS, Start
        from rl_train.engines.workers.rollout_worker import agent_fields

        owners = [i for i in range(len(prompts)) for _ in range(n)]
        loops = [self.agent.loop_for(prompts[i]) for i in owners]
        results: dict[str, Any] = {}
        for loop in dict.fromkeys(loops):
            starts: list[Start] = [
                (str(j), self.encode_prompt(prompts[i]["prompt"]), []) for j, i in enumerate(owners) if loops[j] == loop
            ]
            # no stop (an evaluation runs to its end), no early hand-off, no starts queued later
            finished = AGENT_LOOPS.get(loop)(self.engine, starts, params, self.agent, None, None, None)
            results.update((t.request_id, t) for t in finished)
        trajectories = []
        for j, i in enumerate(owners):
            result, row = results[str(j)], prompts[i]
            record = {
                "response_ids": result.response_ids,
                "data_source": row["data_source"],
                "ground_truth": str(row["ground_truth"]),
                "stop_reason": result.stop_reason,
                **(agent_fields(result) if loops[j] != "single_turn" else {}),
            }
            trajectories.append(self.reader.trajectory(record, row))
        scored = self.router.score(trajectories)
        return [
            ScoredAnswer(i, t.prompt, t.response, t.ground_truth, r.score, t.stop_reason)
            for i, t, r in zip(owners, trajectories, scored, strict=True)
        ]
