"""What the Prefect UI shows of an evaluation: a table of the step's results and the reward
curve of every dataset across the evaluated steps (R-10.1).

The chart and its figures are the run page's (``ui.curve_markdown``, an inline SVG); keys
follow ``ui.artifact_key``, so the latest evaluation of a run is one click away in the
artifact list. Nothing is published outside a flow run (``rl-train eval --no-prefect``).
"""

from __future__ import annotations

from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.context import FlowRunContext

from rl_train.flows.reward_chart import Series, series_of
from rl_train.flows.ui import artifact_key, curve_markdown
from rl_train.storage.eval_results import latest_rewards

COLORS = ("#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
"""One per dataset; ``val`` first, in the run page's validation colour."""


def results_table(step: int, datasets: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per dataset evaluated at ``step``."""
    return [
        {
            "dataset": name,
            "step": step,
            "reward_mean": round(entry["reward_mean"], 6),
            "count": entry["count"],
            "prompts": entry["num_prompts"],
            "temperature": entry["settings"]["temperature"],
            "n": entry["settings"]["n"],
        }
        for name, entry in datasets.items()
    ]


def eval_series(history: list[dict[str, Any]]) -> list[Series]:
    """Each dataset's reward over the steps evaluated (the latest evaluation of a step counts)."""
    curves = latest_rewards(history)
    names = sorted(curves, key=lambda name: (name != "val", name))
    return [
        series_of(
            [{"step": step, name: reward} for step, reward in curves[name].items()],
            name,
            COLORS[i % len(COLORS)],
        )
        for i, name in enumerate(names)
    ]


def eval_curve_markdown(run_name: str, history: list[dict[str, Any]]) -> str:
    return curve_markdown(
        f"Evaluation reward of {run_name}", eval_series(history), f"{run_name}: evaluation reward"
    )


def publish_eval(
    run_name: str, step: int, datasets: dict[str, dict[str, Any]], history: list[dict[str, Any]]
) -> None:
    """The table of this evaluation and the curve over every evaluation of the run so far."""
    if FlowRunContext.get() is None:
        return
    create_table_artifact(
        results_table(step, datasets),
        key=artifact_key(run_name, "eval"),
        description=f"{run_name}: evaluation of checkpoint step {step}",
    )
    create_markdown_artifact(
        eval_curve_markdown(run_name, history),
        key=artifact_key(run_name, "eval-curve"),
        description=f"{run_name}: evaluation reward per dataset across the evaluated checkpoints",
    )
