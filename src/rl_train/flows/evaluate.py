"""The ``rl-eval`` flow: evaluate a run's newest complete checkpoint (R-10.1).

It picks the newest checkpoint with a manifest (or the step asked for), copies its ``policy/``
to a temporary folder, checked file by file against the manifest, and scores the policy's
answers on the run's validation set and on any extra datasets
(``rl_train.engines.rollout.evaluation``). The results go to ``<checkpoint root>/eval/``
(``rl_train.storage.eval_results``); a flow run also publishes them as artifacts (``eval_page``).

It never gets in the way of a training run writing the same checkpoints: it takes no lock,
reads only committed checkpoints (a step folder without a manifest is a write in progress and
is never listed), and writes only under ``eval/``, which the store neither lists nor prunes.
A checkpoint that turns out damaged, or that the run prunes while it is being copied, is
skipped with a warning for the newest other one, listed afresh (unless a step was asked for).
A step already evaluated on a dataset with the same settings is not evaluated again, so a
schedule may fire as often as it likes; ``force`` re-evaluates.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.runtime import flow_run as this_flow_run

from rl_train.engines.reward.router import RewardRouter
from rl_train.engines.rollout.evaluation import PolicyEvaluator
from rl_train.flows.base import POLICY_DIR
from rl_train.flows.eval_page import publish_eval
from rl_train.flows.eval_target import EvalTarget
from rl_train.storage.checkpoint import CheckpointError, step_dir_name
from rl_train.storage.dataset import load_prompts

logger = logging.getLogger(__name__)
NUM_SAMPLES_KEPT = 4
"""Answers kept per dataset in the step's document, to read what the policy says."""


@dataclass(frozen=True)
class EvalOutcome:
    target: EvalTarget
    step: int
    document: dict[str, Any]
    """The step's results document (every dataset evaluated at this step so far)."""
    evaluated: list[str]
    """The datasets evaluated by this call ([]: the step was evaluated already)."""

    def summary(self) -> dict[str, Any]:
        datasets = self.document.get("datasets", {})
        return {
            "run_dir": self.target.run_dir,
            "step": self.step,
            "skipped": not self.evaluated,
            "results": self.target.results.step_uri(self.step),
            "reward_mean": {name: entry["reward_mean"] for name, entry in datasets.items()},
        }


def evaluate_run(
    run_dir: str,
    step: int | None = None,
    extra_val_files: list[str] | None = None,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    n: int = 1,
    force: bool = False,
    root: str | None = None,
) -> EvalOutcome:
    """Evaluate the newest complete checkpoint of ``run_dir`` (or ``step``), unless done already;
    see the module docstring. ``root``: where relative paths resolve (default: this directory)."""
    target = EvalTarget.open(
        run_dir, root or str(Path.cwd()), extra_val_files, max_new_tokens, temperature, n
    )
    failed: dict[int, str] = {}
    while True:
        k = target.next_step(step, failed)
        pending = target.pending(k, force)
        if not pending:
            print(
                f"checkpoint step {k} of {target.run_dir} is already evaluated: {target.results.step_uri(k)}"
            )
            return EvalOutcome(target, k, target.results.read_step(k) or {}, [])
        router = RewardRouter(target.config.reward, target.config.sandbox)
        prompts = {name: load_prompts(target.datasets[name], check_data_source=router.route) for name in pending}
        with tempfile.TemporaryDirectory(prefix="rlt-eval-") as tmp:
            try:
                policy = target.store.download_dir(k, POLICY_DIR, Path(tmp) / step_dir_name(k))
            except CheckpointError as exc:  # damaged, or pruned by the run while we copied it
                if step is not None:
                    raise
                logger.warning("skipping checkpoint %s: %s", target.store.step_uri(k), exc)
                failed[k] = str(exc)
                continue
            scored = score_policy(target, k, policy, prompts)
        return record_results(target, k, scored)


def score_policy(
    target: EvalTarget, step: int, policy_dir: Path, prompts: dict[str, list[dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    """Each dataset's reward mean, answer count and first few answers."""
    config, settings = target.config, target.settings
    evaluator = PolicyEvaluator(
        policy_dir, engine=config.rollout.engine, seed=config.run.seed, agent=config.rollout.agent.model_dump(),
        sandbox=config.sandbox.model_dump(), reward=config.reward.model_dump(),
    )
    scored = {}
    for name, rows in prompts.items():
        answers = evaluator.answer(rows, settings.sampling(config.run.seed), settings.n)
        rewards = [a.reward for a in answers]
        scored[name] = {
            "files": target.datasets[name],
            "reward_mean": sum(rewards) / len(rewards),
            "count": len(rewards),
            "num_prompts": len(rows),
            "samples": [asdict(a) for a in answers[:NUM_SAMPLES_KEPT]],
        }
        print(
            f"{target.run_name} step {step} {name}: reward {scored[name]['reward_mean']:.4f} over {len(rewards)} answers"
        )
    return scored


def record_results(target: EvalTarget, step: int, scored: dict[str, dict[str, Any]]) -> EvalOutcome:
    """Write the step's document (datasets evaluated earlier are kept) and the new history rows."""
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for entry in scored.values():
        entry.update(settings=target.settings.as_dict(), evaluated_at=now)
    earlier = (target.results.read_step(step) or {}).get("datasets", {})
    document = {
        "run_dir": target.run_dir,
        "checkpoint": target.store.step_uri(step),
        "step": step,
        "datasets": {**earlier, **scored},
    }
    target.results.write_step(step, document)
    target.results.append_history(
        [
            {
                "step": step,
                "dataset": name,
                "reward": e["reward_mean"],
                "count": e["count"],
                "evaluated_at": now,
            }
            for name, e in scored.items()
        ]
    )
    return EvalOutcome(target, step, document, list(scored))


def eval_run_name() -> str:
    """``<run>/eval``: the runs list tells apart the evaluations of two runs."""
    run_dir = str(this_flow_run.parameters.get("run_dir", "run"))
    return f"{run_dir.rstrip('/').rsplit('/', 1)[-1]}/eval"


@flow(name="rl-eval", flow_run_name=eval_run_name, log_prints=True)
def eval_flow(
    run_dir: str,
    step: int | None = None,
    extra_val_files: list[str] | None = None,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    n: int = 1,
    force: bool = False,
    root: str | None = None,
) -> dict[str, Any]:
    """Evaluate the newest complete checkpoint of ``run_dir`` (or ``step``) on its validation
    set and ``extra_val_files``: greedy, one answer per prompt, unless the run's
    ``rollout.val_temperature`` or ``temperature`` / ``n`` say otherwise. A flow run publishes
    the results table and the reward curve across the evaluated steps as artifacts."""
    outcome = evaluate_run(run_dir, step, extra_val_files, max_new_tokens, temperature, n, force, root)
    if outcome.evaluated:
        datasets = {name: outcome.document["datasets"][name] for name in outcome.evaluated}
        publish_eval(outcome.target.run_name, outcome.step, datasets, outcome.target.results.history())
    return outcome.summary()
