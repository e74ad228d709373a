"""A rollout replica: turns prompt records into trajectory records (R-5.1, R-5.2, R-2.5)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import ray

from rl_train.engines.agent.chat import generation_spans
from rl_train.engines.agent.config import AgentConfig
from rl_train.engines.agent.registry import AGENT_LOOPS, Start
from rl_train.engines.rollout.protocol import SamplingParams
from rl_train.engines.rollout.registry import build_rollout_engine
from rl_train.engines.rollout.tool_env import DelayedCalls, ToolEnvConfig
from rl_train.engines.weight_sync.base import WeightReceiver
from rl_train.engines.workers.generation_loop import GatedEngine, GenerationLoop, More
from rl_train.engines.workers.host_memory import freeze_built_objects, keep_freed_memory, release_freed_memory
from rl_train.engines.workers.named_actor import resolve_actor
from rl_train.engines.workers.placement import check_device
from rl_train.engines.workers.turn_taking import TurnTakingEngine
from rl_train.storage.checkpoint import CheckpointStore, PartEntry


def _import_engine_side() -> None:
    """Bind what this actor's methods use and the driver never does, as module globals, in
    the actor's process only (``__init__`` calls this first). The driver imports this module
    for the class, to create the actor; with these at the top it would import torch (about
    3 s of CPU at every start, on the cores the run's other processes start on) for a
    process that never touches a tensor. ``tests/unit/test_driver_imports.py`` holds it."""
    global torch, run_receiver, rng_state, set_rng_state
    import torch

    from rl_train.engines.weight_sync.boundaries import run_receiver
    from rl_train.engines.workers.checkpoint_io import rng_state, set_rng_state


def agent_fields(trajectory: Any) -> dict[str, Any]:
    """What a multi-turn trajectory adds to its record (R-5.6): which tokens the model generated
    (the mask, and its turns as ``[start, end)`` spans of the response), its turn count and its
    tool calls as ``[name, error, seconds]``."""
    return {
        "response_mask": list(trajectory.response_mask),
        "generation_spans": generation_spans(list(trajectory.response_mask)),
        "agent_turns": trajectory.turns,
        "tool_calls": [[call.name, call.error, call.seconds] for call in trajectory.tool_calls],
    }


class RolloutWorker:
    def __init__(
        self,
        model_path: str,
        tq: Any,
        seed: int,
        num_threads: int,
        tool_env: dict[str, Any] | None = None,
        engine: str = "torch",
        engine_options: dict[str, Any] | None = None,
        device: str = "cpu",
        agent: dict[str, Any] | None = None,
        rescue: bool = False,
    ) -> None:
        """``tool_env``: a ``rollout.tool_env`` dump; its tool call follows every train trajectory.
        ``engine``: the registered rollout engine (``rollout.engine``), built with ``engine_options``
        (its own config section, ``rollout.sglang`` for sglang), on ``device`` (``rollout.device``:
        Ray gives the actor its GPU share and sets which GPU it sees). ``agent``: a ``rollout.agent``
        dump, which agent loop answers each prompt. ``rescue``: the training rank's spare engine
        (R-2.7): it samples with the trainer's current weights, not pi_old's, whatever version
        they are tagged with, so its records say ``off_version``."""
        keep_freed_memory()  # before the model: its tensors' pages stay the process's
        _import_engine_side()
        torch.set_num_threads(num_threads)
        torch.set_flush_denormal(True)  # denormal floats in a tiny model slow CPU kernels 10x
        check_device(device, "rollout.device")
        self.engine = build_rollout_engine(engine, model_path, seed=seed, device=device, options=engine_options)
        self.tokenizer = self.engine.tokenizer
        self.tq = resolve_actor(tq)
        self.rescue = rescue
        self.off_version = rescue
        """Whether the weights served may not be exactly the version they are tagged with."""
        self._off_versions: set[int] = set()
        """Versions this replica served off (a revive's push): a record with a token of one says
        ``off_version`` (never copied as pi_old's log-probs), whenever it is written."""
        self._next_push_off_version = False
        self.receiver: WeightReceiver | None = None
        self.tool_latency = ToolEnvConfig(**(tool_env or {})).build()
        self.agent = AgentConfig.model_validate(agent or {})
        self.tool_calls = DelayedCalls()
        self.turns = TurnTakingEngine(self.engine)
        self.loop = GenerationLoop(
            self._generate_in_background, self.engine.abort, batches_in_flight=self.agent.batches_in_flight
        )
        self.background = GatedEngine(self.turns, self.loop)
        """The engine as background generation sees it: its calls wait out a pause."""
        self._incarnation = uuid.uuid4().hex
        """New each time the actor is (re)constructed: how the pools notice a restart."""
        if not rescue:  # the spare shares a training rank's process, which froze its own at start
            freeze_built_objects()  # the start-up's objects leave the collector's full passes

    def where(self) -> dict[str, str]:
        """The node this actor runs on: Ray's id and address of it."""
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address()}

    def incarnation(self) -> str:
        return self._incarnation

    def encode_prompt(self, text: str) -> list[int]:
        return [self.tokenizer.bos_token_id, *self.tokenizer.encode(text, add_special_tokens=False)]

    def generate_prompts(
        self, partition: str, prompt_keys: list[str], n: int, params: dict[str, Any]
    ) -> list[str]:
        """Sample ``n`` trajectories per prompt (blocking, tool calls included); returns the keys written."""
        written, _, tool_deadlines = self._generate(partition, prompt_keys, n, params)
        if tool_deadlines:
            time.sleep(max(max(tool_deadlines.values()) - time.time(), 0.0))
            self._finish_groups(partition, list(tool_deadlines))
        return written

    def _generate_in_background(
        self, partition: str, prompt_keys: list[str], n: int, params: dict[str, Any], more: More
    ) -> list[str]:
        """The generation loop's batch: groups finish when their tool calls return (no waiting
        here); a multi-turn batch takes in more queued groups as it runs (``more``)."""
        _, unfinished, tool_deadlines = self._generate(partition, prompt_keys, n, params, self.background, more)
        for key, deadline in tool_deadlines.items():
            self.tool_calls.call_at(deadline, lambda key=key: self._finish_groups(partition, [key]))
        return unfinished

    def _finish_groups(self, partition: str, keys: list[str]) -> None:
        ray.get(
            self.tq.set_tags.remote(partition, {k: {"status": "finished", "partial": False} for k in keys})
        )

    def _generate(
        self,
        partition: str,
        prompt_keys: list[str],
        n: int,
        params: dict[str, Any],
        engine: Any = None,
        more: More | None = None,
    ) -> tuple[list[str], list[str], dict[str, float]]:
        """(trajectory keys written, prompt keys left unfinished by an abort, tool deadlines).

        A prompt tagged ``partial`` continues its aborted trajectories from their tokens
        (``response_prefix``) under the weights served now; finished siblings are kept. An
        abort leaves the prompt ``pending`` with its partial trajectories stored (R-2.5).
        A group whose trajectories have all ended (and none aborted) is written and tagged
        ``finished`` as soon as its last one ends, while the rest of the batch goes on: a
        multi-turn batch hands its groups to the trainer as they finish, not at its slowest
        tool call. With a tool environment, each train trajectory's tool call starts when its
        generation ends; its group stays ``running`` until the group's last call returns
        (the returned wall-clock deadline, per prompt key), and the caller finishes it then.
        ``engine``: the one the loops call (background generation's gated one); the replica's
        own by default (a blocking call). ``more``: background generation's call for more queued
        groups, which a multi-turn loop makes between rounds: they join this batch (a group
        routed to another loop runs once this loop's batch has ended).
        """
        keys: list[str] = []
        """Every prompt of this batch, those taken in as it ran included."""
        by_key: dict[str, dict[str, Any]] = {}
        earlier: dict[str, dict[str, Any]] = {}
        loop_of: dict[str, str] = {}
        expected: dict[str, int] = {}
        with_tools = self.tool_latency is not None and partition == "train"
        early: dict[str, list[Any]] = {}
        """Groups written as soon as they finished: prompt key -> their trajectories."""
        ended: dict[str, list[Any]] = {}
        writes: list[Any] = []
        results: list[Any] = []

        def take(new_keys: list[str]) -> dict[str, list[Start]]:
            """Tag ``new_keys`` running; their trajectories' starts, by agent loop."""
            prompts, prompt_tags, _ = ray.get(
                [
                    self.tq.get.remote(partition, new_keys),
                    self.tq.get_tags.remote(partition, new_keys),
                    self.tq.set_tags.remote(partition, {k: {"status": "running"} for k in new_keys}),
                ]
            )
            keys.extend(new_keys)
            by_key.update(zip(new_keys, prompts, strict=True))
            earlier.update(self._partials(partition, new_keys, prompt_tags, n))
            starts: dict[str, list[Start]] = {}
            for key, prompt in zip(new_keys, prompts, strict=True):
                loop_of[key] = self.agent.loop_for(prompt)
                ids = self.encode_prompt(prompt["prompt"])
                expected[key] = 0
                for j in range(n):
                    old = earlier.get(f"{key}/{j}")
                    if old is None or old["stop_reason"] == "aborted":
                        # a single turn continues its partial rollout; a tool loop starts afresh
                        prefix = list(old["response_ids"]) if old and loop_of[key] == "single_turn" else []
                        starts.setdefault(loop_of[key], []).append((f"{key}/{j}", ids, prefix))
                        expected[key] += 1
            return starts

        def on_done(trajectory: Any) -> None:  # called on this thread by the loops
            key = trajectory.request_id.rsplit("/", 1)[0]
            ended.setdefault(key, []).append(trajectory)
            group = ended[key]
            if with_tools or len(group) < expected[key] or any(t.stop_reason == "aborted" for t in group):
                return
            records, tags = self._records(group, earlier, loop_of, by_key, False)
            # submitted, not awaited: one caller's calls reach the queue actor in order
            writes.append(self.tq.put.remote(partition, records, tags))
            writes.append(self.tq.set_tags.remote(partition, {key: {"status": "finished", "partial": False}}))
            early[key] = group

        try:
            pending = take(prompt_keys)
            sampling = SamplingParams(**params)
            stop = self.loop.stopping
            while pending:
                loop = next(iter(pending))
                batch = pending.pop(loop)

                def admit(loop: str = loop) -> list[Start]:
                    """More queued groups, while this batch has room for them: the starts of
                    those this loop answers (the others wait for their own loop's turn)."""
                    if more is None or not self.loop.queued():  # asked every poll: the common answer, cheaply
                        return []
                    unfinished = sum(1 for k in keys if k not in early and len(ended.get(k, [])) < expected[k])
                    new = more(self.loop.max_groups_per_batch - unfinished)
                    if not new:
                        return []
                    starts = take(new)
                    for other, other_starts in starts.items():
                        if other != loop:
                            pending.setdefault(other, []).extend(other_starts)
                    return starts.get(loop, [])

                results += AGENT_LOOPS.get(loop)(
                    engine or self.turns, batch, sampling, self.agent, stop, on_done, admit if more is not None else None
                )
        except Exception:
            failed = {k: {"status": "failure"} for k in dict.fromkeys([*prompt_keys, *keys]) if k not in early}
            ray.get([*writes, self.tq.set_tags.remote(partition, failed)])
            raise
        rest = [r for r in results if r.request_id.rsplit("/", 1)[0] not in early]
        records, tags = self._records(rest, earlier, loop_of, by_key, with_tools)
        writes.append(self.tq.put.remote(partition, records, tags))
        unfinished = sorted({k.rsplit("/", 1)[0] for k, t in tags.items() if t["status"] == "aborted"})
        done = [k for k in keys if k not in unfinished and k not in early]

        def group(key: str) -> list[dict[str, Any]]:  # this batch's trajectories, else the stored ones
            return [records.get(f"{key}/{j}") or earlier[f"{key}/{j}"] for j in range(n)]

        tool_deadlines = (
            {k: max(float(r.get("tool_done_at", 0.0)) for r in group(k)) for k in done} if with_tools else {}
        )
        status = {k: {"status": "finished", "partial": False} for k in done if k not in tool_deadlines}
        for key in unfinished:
            oldest = min((v for r in group(key) for v in r["token_versions"]), default=None)
            status[key] = {"status": "pending", "partial": True}
            if oldest is not None:
                status[key]["version"] = oldest
        writes.append(self.tq.set_tags.remote(partition, status))
        ray.get(writes)
        written = [t.request_id for g in early.values() for t in g] + list(records)
        return written, unfinished, tool_deadlines

    def _records(
        self,
        results: list[Any],
        earlier: dict[str, dict[str, Any]],
        loop_of: dict[str, str],
        by_key: dict[str, dict[str, Any]],
        with_tools: bool,
    ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """The queue records and tags of finished trajectories (R-5.6): a continued single turn
        keeps its earlier tokens' log-probs and versions; a multi-turn one adds its mask and turns."""
        records, tags = {}, {}
        for result in results:
            key = result.request_id.rsplit("/", 1)[0]
            fresh = loop_of[key] != "single_turn"
            old = (None if fresh else earlier.get(result.request_id)) or {"rollout_log_probs": [], "token_versions": []}
            versions = list(old["token_versions"]) + result.token_versions
            records[result.request_id] = {
                "prompt_ids": result.prompt_ids,
                "response_ids": result.response_ids,
                "rollout_log_probs": list(old["rollout_log_probs"]) + result.log_probs,
                "token_versions": versions,
                "stop_reason": result.stop_reason,
                **({"routes": result.routes} if result.routes is not None else {}),  # R3: the experts rollout used
                **(agent_fields(result) if fresh else {}),
                "group_id": key,
                "data_source": by_key[key]["data_source"],
                "ground_truth": by_key[key]["ground_truth"],
                **({"off_version": True} if self.rescue or self._off_versions.intersection(versions) else {}),
            }
            if with_tools and result.stop_reason != "aborted":
                assert self.tool_latency is not None
                latency = self.tool_latency(result.request_id)
                records[result.request_id].update(tool_latency_seconds=latency, tool_done_at=time.time() + latency)
            tags[result.request_id] = {
                "kind": "trajectory",
                "status": result.stop_reason,
                "group_id": key,
                "prompt_len": len(result.prompt_ids),
                "response_len": len(result.response_ids),
                "version": min(versions, default=self.engine.version),
            }
        return records, tags

    def _partials(
        self, partition: str, keys: list[str], tags: list[dict[str, Any]], n: int
    ) -> dict[str, dict[str, Any]]:
        """Stored trajectories of the prompts that an abort left partial."""
        wanted = [f"{k}/{j}" for k, t in zip(keys, tags, strict=True) if t.get("partial") for j in range(n)]
        return (
            dict(zip(wanted, ray.get(self.tq.get.remote(partition, wanted)), strict=True)) if wanted else {}
        )

    # -- non-blocking dispatch (the async modes) -----------------------------------------
    def enqueue(self, partition: str, prompt_keys: list[str], n: int, params: dict[str, Any]) -> None:
        """Queue prompts for background generation and return at once."""
        self.loop.enqueue(partition, prompt_keys, n, params)

    def pause_generation(self) -> None:
        """Abort in-flight requests (kept as partial rollouts) and generate nothing until resumed;
        tool calls in flight go on (``GenerationLoop.pause``)."""
        self.loop.pause()

    def resume_generation(self) -> None:
        self.loop.resume()

    def stop_generation(self) -> None:
        """End everything in flight, tool waits included, as aborted (the end of a run)."""
        self.loop.hold()

    def pop_generation_errors(self) -> list[str]:
        """Errors of background generation and tool calls since the last call (then forgotten:
        the failed prompts are tagged ``failure`` and the replay buffer retries or refills them)."""
        return [*self.loop.pop_errors(), *self.tool_calls.pop_errors()]

    def pop_activity(self) -> dict[str, float]:
        """Engine-busy seconds since the last call (the rest of the wall time rollout was idle),
        the engine batches run and their requests, and the groups whose tool calls are still
        running."""
        return {**self.turns.pop_counts(), "groups_awaiting_tools": float(self.tool_calls.pending())}

    # -- lifecycle and weights ----------------------------------------------------------
    def sleep(self) -> None:
        """The engine frees its KV cache (and on a GPU moves its weights to the host); the
        heap pages that freed go back to the OS too (``host_memory``: kept otherwise)."""
        self.engine.sleep()
        if not self.rescue:  # the spare engine shares the training rank's process and its heap
            release_freed_memory()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def abort(self) -> int:
        return self.engine.abort()

    def save_checkpoint(
        self, root: str, step: int, storage_options: dict[str, Any] | None, index: int
    ) -> list[PartEntry]:
        """This replica's sampling stream and process RNG (its weights come from the trainer)."""
        store = CheckpointStore(root, storage_options=storage_options)
        state = {"sampling": self.engine.sampling_state(), "process": rng_state()}
        return store.write_state(step, f"rollout/replica-{index}/rng", state)

    def load_checkpoint(self, root: str, step: int, storage_options: dict[str, Any] | None, index: int) -> None:
        state = CheckpointStore(root, storage_options=storage_options).read_state(step, f"rollout/replica-{index}/rng")
        self.engine.load_sampling_state(state["sampling"])
        set_rng_state(state["process"])

    def version(self) -> int:
        return self.engine.version

    def open_receiver(self, backend: Any, descriptor: dict[str, Any]) -> None:
        self.receiver = backend.build_receiver(descriptor)

    def close_receiver(self, final: bool = True) -> None:
        """Stop background work and release the receiver's shared memory and sockets (idempotent);
        ``final``, also the engine's own resources (an sglang replica's server).

        ``final=False``: the receiver is being reopened (a replica was revived), so background
        generation goes on once it is closed (paused meanwhile, its tool calls going on)."""
        if final:
            self.loop.hold()
        else:
            self.loop.pause()
        receiver, self.receiver = self.receiver, None
        try:
            if receiver is not None:
                receiver.close()
        finally:
            if not final:
                self.loop.resume()
            else:  # the run is over: an engine with a server of its own stops it, and the gateway
                from rl_train.engines.agent.gateway_runs import stop_gateways

                stop_gateways()
                close = getattr(self.engine, "close", None)
                if close is not None:
                    close()

    def receive_weights(self, payload: Any, version: int, timeout_seconds: float) -> dict[str, float]:
        """Pause the engine, load ``version``, resume: interrupted turns and partial rollouts go
        on under it, and tool calls in flight were never stopped."""
        assert self.receiver is not None, "open_receiver() first"
        self.loop.pause()
        try:
            metrics = run_receiver(self.engine, self.receiver, payload, version, timeout_seconds)
            self.off_version, self._next_push_off_version = self.rescue or self._next_push_off_version, False
            if self.off_version:  # the tokens of this version say so, whenever their record is written
                self._off_versions.add(version)
            return metrics
        finally:
            self.loop.resume()

    def mark_next_push_off_version(self) -> None:
        """The next push's weights are not exactly the version they are tagged with (a revive in
        the middle of a separate_async step pushes the trainer's current weights under pi_old's
        version): until the push after it, records say ``off_version``."""
        self._next_push_off_version = True
