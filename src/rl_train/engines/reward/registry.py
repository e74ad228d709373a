"""The rewards a config or a data row can name (``REWARDS``), and a user's own by import path.

A reward is named in ``reward.by_data_source`` / ``reward.default`` either by its name in
``REWARDS`` or by ``"package.module:attr"``: a function ``(Trajectory) -> RewardResult | float``,
or a class, built once per worker with ``Class.from_settings(settings)`` where it has that
classmethod (the built-in ``code_tests`` and ``numeric`` take their config so), else ``Class()``,
and then called on each trajectory. Names are checked at config load (``check_reward``);
the table names its entries by import path, so reading it imports no reward.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rl_train.registry import Entry, Registry, UnknownNameError, resolve

if TYPE_CHECKING:
    from rl_train.engines.reward.base import BatchReward, Reward
    from rl_train.engines.reward.config import RewardSettings

REWARDS: Registry[Entry[Any]] = Registry(
    "reward",
    "reward.by_data_source and reward.default, or a row's data_source (its exact name, or its "
    "longest prefix before a '/')",
    {
        "arith": Entry(
            "rl_train.engines.reward.rules:exact_answer",
            "The built-in arithmetic task's reward: exact match of the response with the answer.",
        ),
        "exact": Entry(
            "rl_train.engines.reward.rules:exact_answer",
            "1 if the response (up to end of sequence, blanks around it ignored) is the ground truth.",
        ),
        "numeric": Entry(
            "rl_train.engines.reward.rules:NumericMatch",
            "1 if the response's last number equals the ground truth within reward.numeric's tolerances.",
        ),
        "math": Entry(
            "rl_train.engines.reward.rules:MathAnswer",
            "1 if the final answer (last \\boxed{}, else after ####, else the last number) equals the ground truth.",
        ),
        "code_tests": Entry(
            "rl_train.engines.reward.code_tests:CodeTestsReward",
            "The response's Python code run against the row's unit tests in the sandbox: the fraction passed.",
        ),
    },
)

ALLOWED = "a registered reward ({names}) or 'package.module:function_or_Class'"


def check_reward(value: str) -> str:
    """``value`` if it names a reward (registered, or an importable callable); else a
    ``ValueError`` saying what is wrong and what is allowed (for the config's validators)."""
    if ":" not in value:
        if value in REWARDS:
            return value
        raise UnknownNameError(f"got {value!r}: unknown reward; allowed: {ALLOWED.format(names=', '.join(REWARDS.names()))}")
    module_name, _, attr = value.partition(":")
    if not module_name or not attr:
        raise ValueError(f"got {value!r}: an import path is 'package.module:attr', both parts non-empty")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - whatever the user's module raised, named for them
        raise ValueError(f"got {value!r}: module {module_name!r} cannot be imported ({type(error).__name__}: {error})") from None
    target = getattr(module, attr, None)
    if target is None:
        raise ValueError(f"got {value!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(target):
        raise ValueError(
            f"got {value!r}: {attr!r} is a {type(target).__name__}, not callable; a reward is a function "
            "(Trajectory) -> RewardResult | float, or a class whose instances are"
        )
    return value


def build_reward(name: str, settings: RewardSettings) -> Reward | BatchReward:
    """The reward ``name`` (defined in the config, registered, or an import path), ready to score."""
    defined = settings.reward.defined()
    if name in defined:
        return defined[name].build(name, settings)
    target = REWARDS.get(name) if name in REWARDS else resolve(name)
    if isinstance(target, type):
        from_settings = getattr(target, "from_settings", None)
        built: Any = from_settings(settings) if callable(from_settings) else target()
        return built
    return target
