"""What each trainer mode asks of the config (R-2.1, R-2.3): its defaults and its refusals.

The trainer classes (``flows/``) differ by lifecycle hooks; what a mode means for the config
lives here, so that loading and validating a config imports neither Ray, Prefect nor the
flows. ``MODES`` is the one table of modes: each entry names its trainer class by import
path (``flows.registry`` imports it when a run starts) beside its defaults and refusals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rl_train.registry import Entry, Registry

if TYPE_CHECKING:
    from rl_train.config import Config

DefaultValue = Any
"""A plain value, or a callable that gets the raw config data and returns the default."""


@dataclass(frozen=True)
class ModeSpec(Entry[type]):
    """A trainer mode: its trainer class (a ``BaseTrainer`` subclass, by import path) and what
    the mode asks of the config."""

    defaults: dict[str, DefaultValue] = field(default_factory=dict)
    """Dotted config keys this mode defaults differently, applied at load where the user set none."""
    check: Callable[[Config], list[str]] = field(default=lambda config: [])
    """What this mode cannot run with, one dotted-path message each."""


ASYNC_DEFAULTS: dict[str, DefaultValue] = {
    # Stale samples need correcting: on the demo task, colocate_async without IS
    # stayed at 0.09 mean reward after 40 steps, with token-level TIS it reached 0.40
    # (sync: 0.35). The tiny policy moves several nats per version on some tokens.
    "algorithm.rollout_correction.preset": "token_is",
    # Groups are scored as they finish, beside rollout; the buffer samples scored groups only,
    # so a slow grader delays what is trained, never what is generated.
    "reward.streaming": True,
    # The teacher scores each group as it finishes too, beside rollout: its phase then only
    # reads what is there, and scores what is late or was lost with a worker.
    "teacher.streaming": True,
}
COPY_PI_OLD = "algorithm.rollout_correction.bypass_current_version"
"""A trajectory generated wholly by pi_old's weights needs no second pass for its old log-probs
where the engines give the same numbers: in separate_async's tool-task bench 42% of the groups
trained were (their oldest token at pi_old's version), and the old-log-prob pass was a sixth of
the trainer's step (measured at commit a873a26). The async modes default it on where ``copies_are_exact``."""


def _section(data: dict[str, Any], dotted: str) -> dict[str, Any]:
    node: Any = data
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def sync_rollout_correction(data: dict[str, Any]) -> str | None:
    """sync's rollout-correction preset: ``bypass`` (R-7.1) where the rollout's log-probs are
    the training engine's own, else none (old_log_prob is recomputed).

    They are the same numbers when both sides are the built-in torch engines in float32 on
    the CPU, sampling from the whole distribution (top_p 1): the engine conformance suite
    holds them to 1e-5, the weights arrive unconverted, and a sync step (its prefetched round
    included) generates with the weights it trains from. Recomputing them there is a second
    forward pass over the batch for nothing (0.12-0.25 s of a 1.5 s demo step). Any other
    engine, dtype, device or truncated sampling keeps the recompute, and so does a config
    that sets anything under ``algorithm.rollout_correction``."""
    if not engines_give_same_numbers(data) or _section(data, "algorithm").get("rollout_correction"):
        return None
    return "bypass"


def copies_are_exact(data: dict[str, Any], pins_pi_old: bool) -> bool:
    """The async modes' ``bypass_current_version`` default: where the engines give the same
    numbers, pi_old is version ``step - 1`` in every local update (the mode pins it, R-2.8, or
    there is one local update), and every training rank runs its shard alone (a split model's
    ranks run their passes together, over shards the copy would leave uneven)."""
    trainer, actor = _section(data, "trainer"), _section(data, "actor")
    one_update = int(trainer.get("parameter_sync_step", 1)) == 1
    split = bool(actor.get("fsdp")) and int(actor.get("num_ranks", 1)) > 1
    return engines_give_same_numbers(data) and (pins_pi_old or one_update) and not split


def pi_old_copy_errors(pins_pi_old: bool) -> Callable[[Config], list[str]]:
    """A mode's refusal of ``bypass_current_version`` where a copy would not be pi_old's numbers
    (a mode that does not pin pi_old, with more than one local update) or where the ranks'
    passes are collectives."""

    def errors(config: Config) -> list[str]:
        if not config.algorithm.rollout_correction.bypass_current_version:
            return []
        found, actor, pss = [], config.actor, config.trainer.parameter_sync_step
        if not pins_pi_old and pss > 1:
            found.append(
                f"{COPY_PI_OLD}: got true with trainer.parameter_sync_step {pss}: {config.trainer.mode} does "
                "not pin pi_old to local update 0's weights, so from local update 1 on the recomputed old "
                "log-probs are the current weights' and a copy would not be; set it to false"
            )
        split = actor.megatron.tensor_parallel_size * actor.megatron.pipeline_parallel_size > 1 or (
            actor.fsdp and actor.num_ranks > 1
        )
        if split:
            found.append(
                f"{COPY_PI_OLD}: got true with a model split over its ranks (actor.fsdp, or megatron TP/PP): "
                "their forward passes run together over shards the copy would leave uneven; set it to false"
            )
        return found

    return errors


def engines_give_same_numbers(data: dict[str, Any]) -> bool:
    """Whether the rollout's log-probs are the training engine's own under the same weights:
    both the built-in torch engines, float32, on the CPU, sampling from the whole
    distribution (the engine conformance suite holds them to 1e-5)."""
    rollout, actor = _section(data, "rollout"), _section(data, "actor")
    return (
        rollout.get("engine", "torch") == "torch"
        and actor.get("engine", "torch") == "torch"
        and actor.get("dtype", "float32") == "float32"
        and rollout.get("device", "cpu") == "cpu"
        and actor.get("device", "cpu") == "cpu"
        and float(rollout.get("top_p", 1.0)) == 1.0
    )


def _async_buffer_errors(config: Config) -> list[str]:
    """What only the sync buffer does yet."""
    if config.replay.refill_infra_groups:
        return [
            "replay.refill_infra_groups: got true; only the sync mode's buffer refills groups short of "
            "real scores yet (the async buffers' DAPO filter, replay.filter_groups, evicts them)"
        ]
    return []


def _separate_async_errors(config: Config) -> list[str]:
    t, errors = config.trainer, []
    mini = config.actor.ppo_mini_batch_size or t.train_batch_size // t.parameter_sync_step
    if t.train_batch_size != t.parameter_sync_step * mini:
        errors.append(
            f"trainer.train_batch_size ({t.train_batch_size}) must equal trainer.parameter_sync_step "
            f"({t.parameter_sync_step}) x actor.ppo_mini_batch_size ({mini}) in separate_async: "
            f"each local update is one mini-batch (set actor.ppo_mini_batch_size to "
            f"{t.train_batch_size // t.parameter_sync_step} or null)"
        )
    if config.rollout.num_replicas < 1:
        errors.append("rollout.num_replicas: separate_async needs a standalone rollout pool (> 0)")
    if config.rollout.weight_sync.backend == "naive":
        errors.append(
            "rollout.weight_sync.backend: 'naive' hands weights over in one process; "
            "separate_async pushes across pools: use 'bucketed' or 'delta'"
        )
    models = config.reward.model_rewards()
    if models and config.reward.placement != "own_pool":
        errors.append(
            f"reward.placement: got {config.reward.placement!r} with model-based rewards ({', '.join(models)}); "
            "separate_async's rollout pool never sleeps, so a reward model cannot share its devices "
            "(R-2.6): set reward.placement to 'own_pool'"
        )
    return errors


MODES: Registry[ModeSpec] = Registry(
    "trainer mode",
    "trainer.mode",
    {
        "sync": ModeSpec(
            "rl_train.flows.sync:SyncTrainer",
            "rollout and training share the devices and strictly alternate; staleness is always 0 (R-2.4).",
            {"algorithm.rollout_correction.preset": sync_rollout_correction},
            pi_old_copy_errors(False),
        ),
        "colocate_async": ModeSpec(
            "rl_train.flows.colocate_async:ColocateAsyncTrainer",
            "rollout and training share the devices; the long tail of a step's rollouts continues, "
            "partially, under the next step's weights (staleness <= 1, R-2.5).",
            {
                **ASYNC_DEFAULTS,
                COPY_PI_OLD: lambda data: copies_are_exact(data, pins_pi_old=False),
                # at most 1 version behind (R-7.2 staleness 2). Partial rollouts meet it by
                # construction; a group held past its step by a slow tool call is evicted instead.
                "replay.max_off_policy_threshold": 2,
            },
            lambda config: _async_buffer_errors(config) + pi_old_copy_errors(False)(config),
        ),
        "separate_async": ModeSpec(
            "rl_train.flows.separate_async:SeparateAsyncTrainer",
            "a standalone rollout pool that never stops generating; the trainer runs "
            "parameter_sync_step local updates per global step and pushes weights without waiting (R-2.6).",
            {
                **ASYNC_DEFAULTS,
                "trainer.parameter_sync_step": 4,
                "rollout.weight_sync.backend": "bucketed",  # pushes cross pools
                # staleness <= parameter_sync_step versions behind, i.e. staleness
                # <= pss + 1, also for groups that a long tool call kept out past their step.
                "replay.max_off_policy_threshold": lambda data: int(data["trainer"]["parameter_sync_step"])
                + 1,
                COPY_PI_OLD: lambda data: copies_are_exact(data, pins_pi_old=True),
            },
            lambda config: _separate_async_errors(config) + _async_buffer_errors(config) + pi_old_copy_errors(True)(config),
        ),
    },
)
