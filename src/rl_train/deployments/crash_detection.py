"""A served run whose process dies without a word is marked Crashed, so the UI offers Retry.

When a flow run's process ends on its own, ``rl-train serve``'s runner reports the exit. When
the runner goes too (``kill -9`` of serve, a machine that dies, a preempted job), nobody is
left to report and the run would stay Running forever. Prefect's answer (its "zombie flow"
recipe) is two halves, both set up by ``rl-train serve``:

- every ``rl-train`` flow run it starts emits a ``prefect.flow-run.heartbeat`` event every
  ``HEARTBEAT_SECONDS`` (Prefect's floor, where its default is 180 s; the step sub-flows turn
  theirs off, see ``flows/step.py``, and need none: the run is the unit of retry);
- a server-side automation with a *proactive* trigger: after a heartbeat of an ``rl-train``
  run started from a deployment, if neither another heartbeat nor a final state arrives
  within ``SILENCE_SECONDS``, the run is set to Crashed. The server's triggers service
  evaluates it every 5 s. Runs without a deployment (``rl-train train`` against the same
  server) are left alone: they beat at Prefect's default period, which the silence would not
  outlast, and a terminal that watches them reports their death anyway.

``SILENCE_SECONDS`` is two and a half heartbeats: one late or lost heartbeat does not crash a
healthy run, and a killed run is marked Crashed 45 to 80 s after it died (a user's longer
heartbeat period stretches it to two and a half of theirs).
``RL_TRAIN_CRASH_AFTER_SECONDS`` replaces it when serve starts (the automation is the server's,
so the last serve to start sets it for every rl-train run).
"""

from __future__ import annotations

import os
from datetime import timedelta

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification
from prefect.settings import get_current_settings

AUTOMATION_NAME = "rl-train: mark runs without a heartbeat Crashed"
HEARTBEAT_SECONDS = 30
"""Heartbeat period of served runs, unless ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` says otherwise."""
SILENCE_SECONDS = 75
"""How long an ``rl-train`` run may go without a heartbeat before it is marked Crashed."""
SILENCE_ENV = "RL_TRAIN_CRASH_AFTER_SECONDS"
"""Environment variable replacing ``SILENCE_SECONDS``."""
FINAL_EVENTS = ("Completed", "Failed", "Cancelled", "Crashed")
"""A run that reached one of these states stops beating on purpose."""


def heartbeat_seconds() -> int:
    """The period served runs beat at: ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` where the user set
    it, else ours (Prefect's own default, 180 s, would make crash detection take minutes)."""
    flows = get_current_settings().flows
    if "heartbeat_frequency" in flows.model_fields_set and flows.heartbeat_frequency:
        return flows.heartbeat_frequency
    return HEARTBEAT_SECONDS


def silence_seconds() -> float:
    """``RL_TRAIN_CRASH_AFTER_SECONDS``, else ``SILENCE_SECONDS`` (or two and a half heartbeats
    of a longer period); Prefect refuses a proactive trigger shorter than 10 s, and one shorter
    than the heartbeat period would crash healthy runs."""
    raw = os.environ.get(SILENCE_ENV)
    if not raw:
        return max(SILENCE_SECONDS, 2.5 * heartbeat_seconds())
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{SILENCE_ENV}={raw!r} is not a number of seconds") from None
    if value <= heartbeat_seconds() or value < 10:
        raise ValueError(
            f"{SILENCE_ENV}={raw}: must exceed the heartbeat period ({heartbeat_seconds()} s), or "
            "every healthy run would be marked Crashed between two heartbeats"
        )
    return value


def crash_automation(flow_name: str = "rl-train", silence_seconds: float = SILENCE_SECONDS) -> AutomationCore:
    """The automation: silence after a heartbeat of a deployment run of ``flow_name`` -> that
    run is Crashed. Heartbeats and state events both name the flow and the deployment among
    their related resources, so the final states that end the wait match the same filter."""
    return AutomationCore(
        name=AUTOMATION_NAME,
        description=(
            f"A {flow_name} flow run that sent no heartbeat for {silence_seconds:.0f} s (its process or "
            "its rl-train serve was killed) is marked Crashed, so that it can be retried."
        ),
        enabled=True,
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *(f"prefect.flow-run.{s}" for s in FINAL_EVENTS)},
            match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
            match_related=[  # all of them: a run of this flow, started from a deployment
                ResourceSpecification({"prefect.resource.role": "flow", "prefect.resource.name": flow_name}),
                ResourceSpecification({"prefect.resource.role": "deployment"}),
            ],
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=silence_seconds),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {silence_seconds:.0f} s: the run's process is gone",
            )
        ],
    )


def ensure_crash_automation(silence: float = SILENCE_SECONDS) -> str:
    """Create the automation on the configured Prefect server, or bring an existing one (same
    name) up to date: every ``rl-train serve`` may call it. Returns what it did."""
    desired = crash_automation(silence_seconds=silence)
    with get_client(sync_client=True) as client:
        existing = client.read_automations_by_name(AUTOMATION_NAME)
        if not existing:
            client.create_automation(desired)
            return "created"
        current = existing[0]
        if current.trigger == desired.trigger and current.actions == desired.actions and current.enabled:
            return "unchanged"
        client.update_automation(current.id, desired)
        return "updated"
