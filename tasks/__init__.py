"""One Prefect task per RL phase (R-3.1, R-3.2): generate, reward, balance, old_log_prob,
ref, advantage, update, weight_sync, plus validate.

Each task is thin: it joins the run by ``run_id`` (``tasks.context``), calls one engine pool or one
algorithm function, and passes batch ids, never tensors, through Prefect. The undecorated
function of each task is its ``.fn``; the benchmark calls those directly to measure what
Prefect costs.
"""

from rl_train.tasks.phases import (
    PHASES,
    advantage,
    balance,
    generate,
    old_log_prob,
    push_weights,
    ref,
    reward,
    update,
    validate,
    weight_sync,
)

__all__ = [
    "PHASES",
    "advantage",
    "balance",
    "generate",
    "old_log_prob",
    "push_weights",
    "ref",
    "reward",
    "update",
    "validate",
    "weight_sync",
]
