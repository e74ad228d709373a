"""Every registered name a config can select, with a one-line description, read from the registries.

``docs/reference.md`` is generated from this (``rl_train.reference_doc``). The names and their
descriptions come from the registries themselves (``rl_train.registry.registries``: each
table's own summaries, else its implementations' docstrings); this module adds only a title and
a sentence on how to read each registry. A name registered without a description fails the
generator (and with it the reference test), so a new name cannot go undocumented.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rl_train.modes import MODES, ModeSpec
from rl_train.registry import Described, Registry, registries


@dataclass(frozen=True)
class RegistrySection:
    """One registry as the reference shows it: a heading, what selects it, and a line per name."""

    title: str
    selected_by: str
    """The config key (or data column) that names an entry, as it reads in the document."""
    note: str
    """One sentence on how to read the entries (may be empty)."""
    entries: tuple[tuple[str, str], ...]
    """(name, one-line description), sorted by name."""


NOTES: dict[str, str] = {
    "KL estimator": "Raw log-ratios; only k3's exp is bounded at +-20.",
    "loss aggregation mode": "N = sequences, L_i = response tokens of sequence i.",
    "rollout-correction preset": "Explicit fields win over a preset's.",
    "rejection-sampling option": "Comma-separated and ANDed; log_ratio = old - rollout, k2 = 0.5 * "
    "log_ratio^2, k3 = exp(log_ratio) - 1 - log_ratio per token; a single threshold u means [1/u, u] "
    "for k1 and [0, u] for k2/k3.",
    "training engine": "Each passes the engine conformance suite.",
    "rollout engine": "Each passes the rollout conformance suite.",
    "reward": "Beside these names, reward.by_data_source and reward.default take "
    "'package.module:function_or_Class': a function of a Trajectory returning a RewardResult or a number.",
    "weight-sync transport": "Used by `bucketed` and `delta`.",
    "agent loop": "A row's `agent_name`, else `rollout.agent.by_data_source`, else `rollout.agent.default`.",
    "tool": "JSON-schema arguments; every failure is an error observation.",
}
"""How to read a registry's entries, by registry kind (a registry without a note has none)."""


def registry_sections() -> list[RegistrySection]:
    """Every registry a config can select from, in the order ``rl_train.registry`` lists them."""
    sections = []
    for kind, registry in registries().items():
        note = _mode_defaults_note(MODES) if kind == MODES.kind else NOTES.get(kind, "")
        sections.append(RegistrySection(_title(kind), _selected_by(registry), note, tuple(_described(registry))))
    return sections


def _title(kind: str) -> str:
    """"weight-sync backend" -> "Weight-sync backends", "policy loss" -> "Policy losses"."""
    return kind[0].upper() + kind[1:] + ("es" if kind.endswith("s") else "s")


def _selected_by(registry: Registry[Described]) -> str:
    """The registry's ``chosen_by``, each dotted config key and data column in backticks."""
    return re.sub(r"(?<![\w`])([a-z_]+(?:\.[a-z_]+)+|data_source|agent_name)(?![\w`])", r"`\1`", registry.chosen_by)


def _described(registry: Registry[Described]) -> list[tuple[str, str]]:
    """(name, description) per entry, sorted; a name without a description is an error."""
    entries = sorted(registry.describe().items())
    missing = [name for name, text in entries if not text]
    if missing:
        raise ValueError(f"{registry.kind} {', '.join(missing)}: registered without a description")
    return entries


def _mode_defaults_note(modes: Registry[ModeSpec]) -> str:
    """Which config keys each mode defaults differently (where the config sets none)."""
    parts = []
    for name in modes:
        spec = modes[name]
        keys = ", ".join(f"`{key}`" for key in spec.defaults)
        parts.append(f"{name}: {keys}" if keys else f"{name}: none")
    return (
        "Keys each mode defaults where the config leaves them unset (its spec in `src/rl_train/modes.py`): "
        + ("; ".join(parts) + ".")
    )
