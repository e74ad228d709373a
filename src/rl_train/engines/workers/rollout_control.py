"""The rollout replicas' lifecycle as the pools drive it: sleep and wake, pause, resume and stop
background generation, and what the replicas report (errors, versions, activity).

A pause stops the engines only (tool calls in flight go on, ``GenerationLoop.pause``); a stop,
at the end of a run, ends everything in flight.
"""

from __future__ import annotations

import contextlib
from typing import Any

import ray


class RolloutControl:
    """Mixed into ``WorkerPools``: every method goes to each of ``self.rollouts``."""

    rollouts: list[Any]

    def _each_rollout(self, method: str, *args: Any) -> list[Any]:
        return list(ray.get([getattr(r, method).remote(*args) for r in self.rollouts]))

    def sleep_rollouts(self) -> None:
        """Free rollout memory for training (weights and KV cache leave the device)."""
        self._each_rollout("sleep")

    def wake_rollouts(self) -> None:
        self._each_rollout("wake_up")

    def pause_generation(self, missing_ok: bool = False) -> None:
        """Pause the replicas' engines (in-flight requests kept as partial rollouts; tool calls in
        flight go on) and hold background generation until ``resume_generation``.

        ``missing_ok``: a replica that has already died is not an error (teardown paths)."""
        self._on_each_rollout("pause_generation", missing_ok)

    def stop_generation(self, missing_ok: bool = False) -> None:
        """End the replicas' background generation, tool waits included (the end of a run)."""
        self._on_each_rollout("stop_generation", missing_ok)

    def _on_each_rollout(self, method: str, missing_ok: bool) -> None:
        if not missing_ok:
            self._each_rollout(method)
            return
        for replica in self.rollouts:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(getattr(replica, method).remote())

    def resume_generation(self) -> None:
        self._each_rollout("resume_generation")

    def pop_generation_errors(self) -> list[str]:
        """Errors raised in the replicas' background generation since the last call."""
        return [e for replica_errors in self._each_rollout("pop_generation_errors") for e in replica_errors]

    def rollout_versions(self) -> list[int]:
        return [int(v) for v in self._each_rollout("version")]

    def pop_rollout_activity(self) -> list[dict[str, float]]:
        return list(self._each_rollout("pop_activity"))
