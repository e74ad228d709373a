"""Rule-based reward functions, in the ``REWARD_FNS`` table by data_source prefix.

A data_source ``arith/single_digit_sum`` is routed to the function registered as ``arith``
(the longest registered prefix before a ``/`` wins), so a family of tasks shares one grader.
"""

from __future__ import annotations

from collections.abc import Callable

from rl_train.registry import Entry, Registry

RewardFn = Callable[[str, str], float]
"""reward(response_text, ground_truth) -> score."""


def exact_answer(response: str, ground_truth: str) -> float:
    """1 if the response (up to end of sequence, surrounding blanks ignored) is the answer."""
    return 1.0 if response.strip() == ground_truth.strip() else 0.0


REWARD_FNS: Registry[Entry[RewardFn]] = Registry(
    "reward function",
    "a row's data_source (its exact name, or its longest registered prefix before a '/')",
    {"arith": Entry(exact_answer)},
)


def route_reward_fn(data_source: str) -> RewardFn:
    """The reward function for ``data_source``: exact name first, then its prefixes."""
    parts = data_source.split("/")
    for cut in range(len(parts), 0, -1):
        name = "/".join(parts[:cut])
        if name in REWARD_FNS:
            return REWARD_FNS.get(name)
    return REWARD_FNS.get(data_source)  # raises, listing what is registered
