"""Every registered name a config can select, with a one-line description, read from the registries.

``docs/reference.md`` is generated from this (``rl_train.reference_doc``). ``registry_sections``
is the only function that knows where the registries live and how each one describes its
entries: the algorithms' estimators, losses and reward functions say what they are in the first
paragraph of their docstrings; the others carry no description of their own yet, so theirs are
written here, keyed by the name they describe. A name registered without one fails the
generator (and with it the reference test), so a new name cannot go undocumented.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rl_train.modes import ModeSpec
from rl_train.registry import Registry


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


_WRITTEN: dict[str, dict[str, str]] = {
    "trainer mode": {
        "sync": "rollout and training take turns on the same devices; rollout sleeps while the "
        "policy trains and gets the new weights at the end of the step (staleness 0).",
        "colocate_async": "shared devices; rollout generates in the background, is aborted (partial "
        "rollouts kept) and put to sleep for training, then continues under the new weights.",
        "separate_async": "a rollout pool of its own that never sleeps; `trainer.parameter_sync_step` "
        "local updates per global step, the weights pushed at step end without waiting.",
    },
    "KL estimator": {
        "abs": "|log_ratio|.",
        "k1": "log_ratio (log pi - log pi_ref); unbiased, can be negative per token.",
        "k2": "0.5 * log_ratio^2.",
        "k3": "exp(-log_ratio) - 1 + log_ratio (Schulman's low-variance estimator), clamped to [-10, 10].",
        "low_var_kl": "alias of `k3`.",
        "mse": "alias of `k2`.",
    },
    "loss_agg_mode": {
        "seq-mean-token-mean": "sum_i (sum_t l_it / L_i) / N",
        "seq-mean-token-sum": "sum_i (sum_t l_it) / N",
        "seq-mean-token-sum-norm": "sum_i (sum_t l_it / L) / N with a constant L (Dr. GRPO)",
        "token-mean": "sum_it l_it / sum_i L_i",
        "token-sum": "sum_it l_it",
    },
    "rollout-correction preset": {
        "token_is": "token-level IS, weights truncated above 2 (TIS)",
        "seq_is": "sequence-level IS (ratio of the whole response), truncated above 2",
        "token_icepop": "token-level IcePop: weights outside [0.5, 5] set to 0",
        "k3_rs": "reject sequences whose token-mean k3 divergence exceeds 0.01",
        "token_k1_seq_mean_k3_rs": "reject tokens with ratio outside [1/5, 5] and sequences with "
        "token-mean k3 > 0.01",
        "token_is_k3_rs": "`token_is` plus `k3_rs`",
        "bypass": "old_log_prob := rollout log-probs (no recomputation); IS/RS metrics become trivial",
    },
    "rejection-sampling option": {
        "token_k1": "reject a token when its ratio pi_rollout / pi_old = exp(-log_ratio) is outside [lo, hi]",
        "token_k2": "reject a token when its k2 is outside [lo, hi]",
        "token_k3": "reject a token when its k3 is outside [lo, hi]",
        "seq_sum_k1": "reject a whole sequence when the sequence ratio exp(-sum_t log_ratio) is outside [lo, hi]",
        "seq_sum_k2": "reject a whole sequence when sum_t k2 is outside [lo, hi]",
        "seq_sum_k3": "reject a whole sequence when sum_t k3 is outside [lo, hi]",
        "seq_mean_k1": "reject a whole sequence when the geometric-mean ratio exp(-mean_t log_ratio) "
        "is outside [lo, hi]",
        "seq_mean_k2": "reject a whole sequence when mean_t k2 is outside [lo, hi]",
        "seq_mean_k3": "reject a whole sequence when mean_t k3 is outside [lo, hi]",
        "seq_max_k2": "reject a whole sequence when max_t k2 is outside [lo, hi]",
        "seq_max_k3": "reject a whole sequence when max_t k3 is outside [lo, hi]",
    },
    "training engine": {
        "torch": "the policy as an HF model in plain torch, data parallel over `torch.distributed` "
        "(gloo on CPU), AdamW; `actor.fsdp` shards it (FSDP2).",
        "megatron": "megatron-core's `GPTModel` converted from the HF policy (qwen2, llama), its "
        "schedules and distributed optimizer; `actor.megatron` sets tensor and pipeline parallel "
        "sizes. Needs the `megatron` extra; on CPU it runs behind a small layer for megatron's "
        "hard-coded CUDA calls.",
    },
    "rollout engine": {
        "torch": "the built-in batched sampler with a KV cache, in the replica's process, CPU or one GPU.",
        "sglang": "an sglang server, launched per replica (the `sglang` extra, a GPU) or attached to "
        "by `rollout.sglang.url`, driven over its HTTP API only.",
    },
    "weight-sync backend": {
        "naive": "the whole state handed over in one piece (one process; refused by separate_async).",
        "bucketed": "the full weights streamed through two alternating fixed-size buckets over a transport.",
        "delta": "after a full first sync, only the (index, value) entries that changed since the last one.",
    },
    "weight-sync transport": {
        "shm": "shared memory, one host.",
        "tcp": "TCP sockets, across hosts.",
        "torch_dist": "a `torch.distributed` group (gloo on CPU, NCCL on GPU).",
        "mooncake": "Mooncake's transfer engine (TCP with the CPU wheel, RDMA with the CUDA wheel).",
    },
    "agent loop": {
        "single_turn": "one generation per trajectory; an aborted one continues from its tokens "
        "under the new weights.",
        "tool_agent": "the multi-turn tool loop; tool calls as JSON in `<tool_call>` tags, answers "
        "appended as `<tool_response>` ids with mask 0.",
        "gateway_agent": "a black-box agent (`gateway_program` or `gateway_command`) talks to the "
        "replica's OpenAI-compatible gateway; its session is the trajectory.",
    },
    "tool": {
        "calculator": "an arithmetic expression (numbers, + - * / // % ** and parentheses), "
        "evaluated on its syntax tree, bounded.",
        "long_tail": "answers after a heavy-tailed (lognormal) delay, the same for the same query: "
        "a slow sandbox's latency, for benchmarks.",
        "python": "a program in a sandboxed subprocess: time, memory and output limits, no "
        "network, no processes.",
    },
    "tool environment": {
        "none": "no tool call; a group is finished once its last trajectory is generated.",
        "long_tail_sandbox": "a simulated sandbox call of lognormal latency after every train "
        "trajectory; the group finishes when its slowest call returns.",
    },
    "built-in task": {
        "single_digit_sum": "a+b= for single digits; the validation split is all 100 problems.",
        "multi_digit_sum": "sums of two-digit numbers, train and validation problems disjoint.",
        "tool_sum": "three-digit sums answered through the calculator tool (rows name `tool_agent`).",
    },
}
"""Descriptions of the registries whose entries carry none, by registry kind, then name."""


def registry_sections() -> list[RegistrySection]:
    """Every registry a config can select from, in the order the reference lists them."""
    from rl_train.algorithms.advantage import ADV_ESTIMATORS
    from rl_train.algorithms.aggregation import AGGREGATORS
    from rl_train.algorithms.config import ROLLOUT_CORRECTION_PRESETS
    from rl_train.algorithms.kl import KL_ESTIMATORS
    from rl_train.algorithms.policy_loss import POLICY_LOSSES
    from rl_train.algorithms.thresholds import RS_OPTIONS
    from rl_train.engines.agent.registry import AGENT_LOOPS
    from rl_train.engines.agent.tools import TOOLS
    from rl_train.engines.reward.rules import REWARD_FNS
    from rl_train.engines.rollout.registry import ROLLOUT_ENGINES
    from rl_train.engines.rollout.tool_env import TOOL_ENVS
    from rl_train.engines.training.registry import TRAINING_ENGINES
    from rl_train.engines.weight_sync.base import WEIGHT_SYNC_BACKENDS, import_builtin_backends
    from rl_train.engines.weight_sync.transports.base import TRANSPORTS
    from rl_train.modes import MODES
    from rl_train.storage.builtin_data import BUILTIN_TASKS

    import_builtin_backends()
    presets = {name: f"{text} ({_settings(ROLLOUT_CORRECTION_PRESETS[name])})"
               for name, text in _WRITTEN["rollout-correction preset"].items()}  # fmt: skip
    return [
        _section("Trainer modes", "`trainer.mode`", _mode_defaults_note(MODES), _written("trainer mode", MODES)),
        _section("Advantage estimators", "`algorithm.adv_estimator`", "", _documented(ADV_ESTIMATORS)),
        _section("Policy losses", "`actor.policy_loss`", "", _documented(POLICY_LOSSES)),
        _section("KL estimators", "`actor.kl_penalty`, `algorithm.kl_penalty`",
                 "Raw log-ratios; only k3's exp is bounded at +-20.", _written("KL estimator", KL_ESTIMATORS)),
        _section("Loss aggregation modes", "`actor.loss_agg_mode`, `critic.loss_agg_mode`",
                 "N = sequences, L_i = response tokens of sequence i.", _written("loss_agg_mode", AGGREGATORS)),
        _section("Rollout-correction presets", "`algorithm.rollout_correction.preset`",
                 "Explicit fields win over a preset's.", _given(presets, ROLLOUT_CORRECTION_PRESETS, "preset")),
        _section("Rejection-sampling options", "`algorithm.rollout_correction.rollout_rs`",
                 "Comma-separated and ANDed; log_ratio = old - rollout, k2 = 0.5 * log_ratio^2, "
                 "k3 = exp(log_ratio) - 1 - log_ratio per token; a single threshold u means [1/u, u] "
                 "for k1 and [0, u] for k2/k3.", _written("rejection-sampling option", RS_OPTIONS)),
        _section("Training engines", "`actor.engine`", "Each passes the engine conformance suite.",
                 _written("training engine", TRAINING_ENGINES)),
        _section("Rollout engines", "`rollout.engine`", "Each passes the rollout conformance suite.",
                 _written("rollout engine", ROLLOUT_ENGINES)),
        _section("Weight-sync backends", "`rollout.weight_sync.backend`", "",
                 _written("weight-sync backend", WEIGHT_SYNC_BACKENDS)),
        _section("Weight-sync transports", "`rollout.weight_sync.transport`",
                 "Used by `bucketed` and `delta`.", _written("weight-sync transport", TRANSPORTS)),
        _section("Agent loops", "`rollout.agent`",
                 "A row's `agent_name`, else `rollout.agent.by_data_source`, else `rollout.agent.default`.",
                 _written("agent loop", AGENT_LOOPS)),
        _section("Agent tools", "a `tool_agent` trajectory's tool calls",
                 "JSON-schema arguments; every failure is an error observation.", _written("tool", TOOLS)),
        _section("Tool environments", "`rollout.tool_env.name`", "", _written("tool environment", TOOL_ENVS)),
        _section("Reward functions", "a dataset row's `data_source`",
                 "Its exact name, or its longest registered prefix before a `/`.", _documented(REWARD_FNS)),
        _section("Built-in tasks", "`data.builtin_task`", "", _written("built-in task", BUILTIN_TASKS)),
    ]  # fmt: skip


def _section(title: str, selected_by: str, note: str, entries: dict[str, str]) -> RegistrySection:
    return RegistrySection(title, selected_by, note, tuple(sorted(entries.items())))


def _written(kind: str, names: Iterable[str]) -> dict[str, str]:
    """The descriptions written above for ``kind``, one for every registered name."""
    return _given(_WRITTEN[kind], names, kind)


def _given(descriptions: dict[str, str], names: Iterable[str], kind: str) -> dict[str, str]:
    names = list(names)
    missing = [name for name in names if name not in descriptions]
    if missing:
        raise ValueError(f"{kind} {', '.join(missing)}: registered without a description in {__name__}")
    return {name: descriptions[name] for name in names}


def _documented(registry: Registry[Any]) -> dict[str, str]:
    """Each entry's description: the first paragraph of its docstring, on one line."""
    entries = {}
    for name in registry.names():
        doc = inspect.getdoc(registry.get(name)) or ""
        if not doc:
            raise ValueError(f"{registry.kind} {name!r} has no docstring to describe it")
        entries[name] = " ".join(doc.split("\n\n", 1)[0].split())
    return entries


def _settings(fields: Mapping[str, object]) -> str:
    return ", ".join(f"{key}={value}" for key, value in fields.items())


def _mode_defaults_note(modes: Mapping[str, ModeSpec]) -> str:
    """Which config keys each mode defaults differently (where the config sets none)."""
    parts = []
    for name, spec in modes.items():
        keys = ", ".join(f"`{key}`" for key in spec.defaults)
        parts.append(f"{name}: {keys}" if keys else f"{name}: none")
    return (
        "Keys each mode defaults where the config leaves them unset (its spec in `src/rl_train/modes.py`): "
        + ("; ".join(parts) + ".")
    )
