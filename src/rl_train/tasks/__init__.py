"""One Prefect task per RL phase (R-3.1, R-3.2): generate, greedy_baseline, reward, teacher,
balance, old_log_prob, ref, values, advantage, critic_update, update, weight_sync, plus validate.

Each task is thin: it joins the run by ``run_id`` (``tasks.context``), calls one engine pool or one
algorithm function, and passes batch ids, never tensors, through Prefect. The undecorated
function of each task is its ``.fn``; the benchmark calls those directly to measure what
Prefect costs.
"""

from rl_train.tasks.phases import (
    CRITIC_PHASES,
    GREEDY_BASELINE_PHASES,
    PHASES,
    TEACHER_PHASES,
    advantage,
    balance,
    critic_update,
    generate,
    greedy_baseline,
    old_log_prob,
    push_weights,
    ref,
    reward,
    teacher,
    update,
    validate,
    values,
    weight_sync,
)

__all__ = [
    "CRITIC_PHASES",
    "GREEDY_BASELINE_PHASES",
    "PHASES",
    "TEACHER_PHASES",
    "advantage",
    "balance",
    "critic_update",
    "generate",
    "greedy_baseline",
    "old_log_prob",
    "push_weights",
    "ref",
    "reward",
    "teacher",
    "update",
    "validate",
    "values",
    "weight_sync",
]
