"""Where each pool's actors go: devices from config, placement groups from the trainer mode.

``plan_placement`` is pure: from the config it decides what each training rank and rollout
replica asks Ray for, and which placement groups hold them. ``realize`` creates those groups
and turns the plan into ``.options()`` for each actor.

- **CPU** (``actor.device`` / ``rollout.device`` ``cpu``, the default): actors reserve no
  resource and share the machine's cores; with ``ray.spread`` a pool's actors each get a
  bundle of a SPREAD group (a token share of a CPU), so that they land on different nodes.
- **GPU, colocated modes** (``sync``, ``colocate_async``, both pools on ``cuda``): training
  rank i and rollout replica i share one GPU: a bundle of one GPU each, half of it asked by
  each (they take turns: rollout sleeps while training runs).
- **GPU, separate_async** (R-2.6): the standalone rollout pool has devices of its own: a
  bundle, and a whole GPU, per replica, apart from the training ranks' bundles.
- **Reward and teacher workers** (``reward.device``, ``reward.placement``; the same ``teacher.*``): on the CPU they reserve nothing
  (like every CPU pool). On ``cuda`` in a pool of their own (``own_pool``) each gets a bundle of
  one GPU (group ``rewards``); colocated with the rollout (``colocate``), worker i takes
  ``COLOCATED_REWARD_GPU`` of replica i's bundle (round robin), and the replica (and a rank
  sharing that bundle) asks that much less: the reward model sleeps while it does not score
  (R-6.8), so the share is Ray's bookkeeping, not a split of the memory.

Bundles are PACKed (a pool's GPUs on as few nodes as can hold them) unless ``ray.spread``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SPREAD_BUNDLE_CPUS = 0.01
"""A CPU-only ``ray.spread`` bundle's size: a bundle must hold some resource, and the actors
placed in it ask for none (as every CPU pool's actors do), so a token share of a CPU."""
PLACEMENT_TIMEOUT_S = 120.0
COLOCATED_REWARD_GPU = 0.1
"""A colocated reward worker's share of its rollout replica's GPU (taken off the replica's)."""


@dataclass
class Slot:
    """What one actor asks for: a share of GPUs, and a bundle of a named placement group."""

    num_gpus: float = 0.0
    group: str | None = None
    bundle: int = 0


@dataclass
class PlacementPlan:
    groups: dict[str, tuple[list[dict[str, float]], str]] = field(default_factory=dict)
    """Placement group name -> (bundles, strategy)."""
    trainers: list[Slot] = field(default_factory=list)
    rollouts: list[Slot] = field(default_factory=list)
    rewards: list[Slot] = field(default_factory=list)
    teachers: list[Slot] = field(default_factory=list)
    strategy: str = "PACK"
    """How GPU bundles are placed: PACK, or SPREAD with ``ray.spread``."""


def plan_placement(config: Any) -> PlacementPlan:
    """Every pool's slots: the training and rollout pools', then the reward and teacher workers'."""
    plan = _plan_trainers_and_rollouts(config)
    reward = config.reward
    plan.rewards = _plan_scorers(plan, "reward", reward.num_workers, reward.device, reward.placement)
    teacher = config.teacher
    count = teacher.num_workers if teacher.path else 0
    plan.teachers = _plan_scorers(plan, "teacher", count, teacher.device, teacher.placement)
    return plan


def _plan_scorers(plan: PlacementPlan, section: str, workers: int, device: str, placement: str) -> list[Slot]:
    """The slots of a pool of scoring workers (the reward's, the teacher's), by the rules of the
    module docstring: nothing on the CPU, a GPU each in a group of their own, or a share of a
    rollout replica's GPU."""
    if device != "cuda" or not workers:
        return [Slot() for _ in range(workers)]
    if placement == "own_pool":
        group = f"{section}s"
        plan.groups[group] = ([{"GPU": 1.0}] * workers, plan.strategy)
        return [Slot(1.0, group, i) for i in range(workers)]
    if not plan.rollouts or plan.rollouts[0].group is None:
        raise ValueError(
            f"{section}.placement: 'colocate' on {section}.device 'cuda' shares the rollout replicas' GPUs, "
            f"but rollout.device is not 'cuda'; use {section}.placement 'own_pool' or put rollout on cuda"
        )
    slots = []
    for i in range(workers):
        host = plan.rollouts[i % len(plan.rollouts)]
        slots.append(Slot(COLOCATED_REWARD_GPU, host.group, host.bundle))
    hosted = {(s.group, s.bundle) for s in slots}
    for slot in plan.rollouts:
        if (slot.group, slot.bundle) in hosted:
            slot.num_gpus = round(slot.num_gpus - COLOCATED_REWARD_GPU, 6)
    return slots


def _plan_trainers_and_rollouts(config: Any) -> PlacementPlan:
    ranks, replicas = config.actor.num_ranks, config.rollout.num_replicas
    train_gpu, rollout_gpu = config.actor.device == "cuda", config.rollout.device == "cuda"
    strategy = "SPREAD" if config.ray.spread else "PACK"
    plan = PlacementPlan(strategy=strategy)
    if train_gpu and rollout_gpu and config.trainer.mode != "separate_async":
        plan.groups["colocated"] = ([{"GPU": 1.0}] * max(ranks, replicas), strategy)
        plan.trainers = [Slot(0.5, "colocated", i) for i in range(ranks)]
        plan.rollouts = [Slot(0.5, "colocated", i % max(ranks, replicas)) for i in range(replicas)]
        return plan
    for name, count, on_gpu in (("trainers", ranks, train_gpu), ("rollouts", replicas, rollout_gpu)):
        if on_gpu:
            plan.groups[name] = ([{"GPU": 1.0}] * count, strategy)
            slots = [Slot(1.0, name, i) for i in range(count)]
        elif config.ray.spread and count > 1:
            plan.groups[name] = ([{"CPU": SPREAD_BUNDLE_CPUS}] * count, "SPREAD")
            slots = [Slot(0.0, name, i) for i in range(count)]
        else:
            slots = [Slot() for _ in range(count)]
        setattr(plan, name, slots)
    return plan


@dataclass
class Placed:
    """Each pool's actors' ``.options()`` (in actor order), and the placement groups created."""

    trainers: list[dict[str, Any]]
    rollouts: list[dict[str, Any]]
    rewards: list[dict[str, Any]]
    teachers: list[dict[str, Any]]
    groups: list[Any]


def realize(plan: PlacementPlan) -> Placed:
    """Every actor's options under ``plan``; each placement group is ready (its resources
    reserved) when this returns."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    created: dict[str, Any] = {}
    try:
        for name, (bundles, strategy) in plan.groups.items():
            created[name] = placement_group(bundles, strategy=strategy)
            ray.get(created[name].ready(), timeout=PLACEMENT_TIMEOUT_S)
    except BaseException:
        for group in created.values():
            remove_placement_group(group)
        raise

    def options(slot: Slot) -> dict[str, Any]:
        out: dict[str, Any] = {"num_gpus": slot.num_gpus} if slot.num_gpus else {}
        if slot.group is not None:
            out["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                created[slot.group], placement_group_bundle_index=slot.bundle
            )
        return out

    return Placed(
        [options(s) for s in plan.trainers],
        [options(s) for s in plan.rollouts],
        [options(s) for s in plan.rewards],
        [options(s) for s in plan.teachers],
        list(created.values()),
    )


def check_device(device: str, field_name: str) -> None:
    """In the actor: a ``cuda`` pool needs a GPU that this process sees (Ray gives it one)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"{field_name} is 'cuda' but this actor sees no CUDA device (torch {torch.__version__}, "
            f"CUDA build: {torch.version.cuda}); use 'cpu', or run on a node with a GPU and a CUDA torch"
        )
