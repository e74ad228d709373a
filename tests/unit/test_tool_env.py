"""The simulated long-tail tool environment: its latency law, determinism and the timer thread."""

from __future__ import annotations

import math
import threading
import time

import pytest

from rl_train.config import ConfigError, load_config
from rl_train.engines.rollout.tool_env import DelayedCalls, ToolEnvConfig


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def test_default_long_tail_has_p99_over_p50_of_at_least_20() -> None:
    cfg = ToolEnvConfig(name="long_tail_sandbox", latency_median_seconds=0.1)
    latency = cfg.build()
    assert latency is not None
    draws = [latency(f"p{i}/{j}") for i in range(1000) for j in range(8)]
    p50, p99 = _quantile(draws, 0.5), _quantile(draws, 0.99)
    # lognormal: p50 = median, p99 = median * exp(2.326 * 1.4) = 26x; 8000 draws pin both within ~5%.
    assert p50 == pytest.approx(0.1, rel=0.06)
    assert p99 / p50 >= 20
    assert cfg.quantile_seconds(0.99) / cfg.quantile_seconds(0.5) == pytest.approx(
        math.exp(2.3263 * 1.4), rel=1e-3
    )


def test_latency_is_a_pure_function_of_seed_and_key_and_is_capped() -> None:
    first = ToolEnvConfig(name="long_tail_sandbox", seed=3).build()
    second = ToolEnvConfig(name="long_tail_sandbox", seed=3).build()
    other_seed = ToolEnvConfig(name="long_tail_sandbox", seed=4).build()
    assert first is not None and second is not None and other_seed is not None
    keys = [f"p{i}/0" for i in range(50)]
    assert [first(k) for k in keys] == [second(k) for k in keys]  # every mode meets the same tail
    assert [first(k) for k in keys] != [other_seed(k) for k in keys]
    capped = ToolEnvConfig(name="long_tail_sandbox", latency_sigma=5.0, latency_max_seconds=0.5).build()
    assert capped is not None
    assert max(capped(k) for k in keys) == 0.5


def test_none_means_no_tool_call_and_unknown_names_list_the_registered_ones() -> None:
    assert ToolEnvConfig().build() is None
    with pytest.raises(
        ConfigError,
        match=r"rollout\.tool_env\.name: unknown tool environment 'sandbox'.*long_tail_sandbox, none",
    ):
        load_config(None, ["rollout.tool_env.name=sandbox"])


def test_delayed_calls_run_in_deadline_order_without_busy_waiting() -> None:
    calls = DelayedCalls()
    order: list[str] = []
    done = threading.Event()
    now = time.time()
    cpu_before = time.process_time()
    calls.call_at(now + 0.30, lambda: (order.append("late"), done.set()))
    calls.call_at(now + 0.05, lambda: order.append("early"))
    calls.call_at(now - 1.00, lambda: order.append("overdue"))
    calls.call_at(now + 0.10, lambda: 1 / 0)  # a failing call is recorded, the thread goes on
    assert calls.pending() >= 3
    assert done.wait(5)
    assert order == ["overdue", "early", "late"]
    assert time.time() - now >= 0.30
    assert calls.errors == ["ZeroDivisionError: division by zero"]
    assert calls.pending() == 0
    # Sleeping on a condition costs next to no CPU over the 0.3 s (a polling loop would burn it).
    assert time.process_time() - cpu_before < 0.1
