"""A retried run re-runs its steps. Prefect links a sub-flow to its parent by call order, so a
retried ``rl-train`` run's step 3 meets the first try's step 1 link; with results persisted
(``PREFECT_RESULTS_PERSIST_BY_DEFAULT``, a common profile setting) Prefect would hand back
step 1's stored result as step 3's and the run would skip training. The step sub-flow must
never persist its result, whatever the profile says."""

from __future__ import annotations

from prefect.settings import PREFECT_RESULTS_PERSIST_BY_DEFAULT, temporary_settings

from rl_train.flows.base import BaseTrainer
from rl_train.tasks.retry import phase_task, retrying_phase_task


def test_step_sub_flows_and_phase_tasks_never_persist_results() -> None:
    with temporary_settings({PREFECT_RESULTS_PERSIST_BY_DEFAULT: True}):
        assert BaseTrainer.global_step_flow.persist_result is False
        assert phase_task("a")(lambda: None).persist_result is False
        assert retrying_phase_task("b")(lambda: None).persist_result is False


def test_step_settings_turn_the_heartbeat_off_and_are_built_once() -> None:
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings

    from rl_train.flows.step import step_settings

    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):
        seen = []
        for _ in range(2):
            with step_settings():
                assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() is None
                seen.append(get_current_settings())
        assert seen[0] is seen[1]  # derived once, entered each step
        assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() == 30  # the run's own settings are untouched
