"""A rollout replica: turns prompt records into trajectory records (R-5.1, R-5.2, R-2.5)."""

from __future__ import annotations

import time
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any

import ray

from rl_train.engines.agent.config import AgentConfig
from rl_train.engines.agent.loop import AgentTrajectory
from rl_train.engines.agent.registry import AGENT_LOOPS, Start
from rl_train.engines.rollout.protocol import RolloutEngine, SamplingParams
from rl_train.engines.rollout.registry import build_rollout_engine
from rl_train.engines.rollout.tool_env import DelayedCalls, ToolEnvConfig
from rl_train.engines.weight_sync.base import WeightReceiver, WeightSyncBackend
from rl_train.engines.workers.generation_loop import GatedEngine, GenerationLoop, More
from rl_train.engines.workers.host_memory import freeze_built_objects, keep_freed_memory, release_freed_memory
from rl_train.engines.workers.named_actor import NamedActor, resolve_actor
from rl_train.engines.workers.placement import check_device
from rl_train.engines.workers.reward_stream import ScoreHandoff
from rl_train.engines.workers.rollout_batch import (
    FINISHED,
    SINGLE_TURN,
    Record,
    RolloutBatch,
    agent_fields,
    group_of,
)
from rl_train.engines.workers.turn_taking import TurnTakingEngine
from rl_train.storage.checkpoint import CheckpointStore, PartEntry

if TYPE_CHECKING:  # bound for real by ``_import_engine_side``, in the actor's process only
    import torch

    from rl_train.engines.weight_sync.boundaries import run_receiver
    from rl_train.engines.workers.checkpoint_io import rng_state, set_rng_state


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


class RolloutWorker:
    def __init__(
        self,
        model_path: str,
        tq: Any,
        seed: int,
        num_threads: int,
        tool_env: dict[str, Any] | None = None,
        engine: str = "torch",
        engine_options: dict[str, object] | None = None,
        device: str = "cpu",
        agent: dict[str, Any] | None = None,
        rescue: bool = False,
        sandbox: dict[str, Any] | None = None,
        scorers: list[NamedActor] | None = None,
        teachers: list[NamedActor] | None = None,
    ) -> None:
        """``tool_env``: a ``rollout.tool_env`` dump; its tool call follows every train trajectory.
        ``engine``: the registered rollout engine (``rollout.engine``), built with ``engine_options``
        (its own config section, ``rollout.sglang`` for sglang), on ``device`` (``rollout.device``:
        Ray gives the actor its GPU share and sets which GPU it sees). ``agent``: a ``rollout.agent``
        dump, which agent loop answers each prompt; ``sandbox``: a ``sandbox`` dump, how its tools
        run untrusted code. ``rescue``: the training rank's spare engine
        (R-2.7): it samples with the trainer's current weights, not pi_old's, whatever version
        they are tagged with, so its records say ``off_version``. ``scorers``: the reward
        workers (``reward.streaming``): each train group goes to its owner's queue as it is
        tagged finished, without waiting for its scores; ``teachers``: the teacher workers
        (``teacher.streaming``), handed the same groups apart, sharded over their own pool."""
        keep_freed_memory()  # before the model: its tensors' pages stay the process's
        _import_engine_side()
        torch.set_num_threads(num_threads)
        torch.set_flush_denormal(True)  # denormal floats in a tiny model slow CPU kernels 10x
        check_device(device, "rollout.device")
        self.engine: RolloutEngine = build_rollout_engine(
            engine, model_path, seed=seed, device=device, options=engine_options
        )
        self.tokenizer = self.engine.tokenizer
        self.tq = resolve_actor(tq)
        self.scoring = ScoreHandoff(list(scorers or []))
        self.teaching = ScoreHandoff(list(teachers or []), pool="teacher")
        self.rescue = rescue
        self.off_version = rescue
        """Whether the weights served may not be exactly the version they are tagged with."""
        self._off_versions: set[int] = set()
        """Versions this replica served off (a revive's push): a record with a token of one says
        ``off_version`` (never copied as pi_old's log-probs), whenever it is written."""
        self._next_push_off_version = False
        self.receiver: WeightReceiver | None = None
        self.tool_latency = ToolEnvConfig(**(tool_env or {})).build()
        self.agent = AgentConfig.model_validate(agent or {}).with_sandbox(sandbox)
        self.tool_calls = DelayedCalls()
        self.turns = TurnTakingEngine(self.engine)
        self.loop = GenerationLoop(
            self._generate_in_background, self.engine.abort, batches_in_flight=self.agent.batches_in_flight
        )
        self.background = GatedEngine(self.turns, self.loop)
        """The engine as background generation sees it: its calls wait out a pause."""
        self._generated_tokens = 0
        """Tokens sampled into written trajectories since ``pop_activity`` (``rollout/tokens_per_second``)."""
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
            self._finish_groups(partition, list(tool_deadlines), n)
        return written

    def _generate_in_background(
        self, partition: str, prompt_keys: list[str], n: int, params: dict[str, Any], more: More
    ) -> list[str]:
        """The generation loop's batch: groups finish when their tool calls return (no waiting
        here); a multi-turn batch takes in more queued groups as it runs (``more``)."""
        _, unfinished, tool_deadlines = self._generate(partition, prompt_keys, n, params, self.background, more)
        for key, deadline in tool_deadlines.items():
            self.tool_calls.call_at(deadline, partial(self._finish_groups, partition, [key], n))
        return unfinished

    def _finish_groups(self, partition: str, keys: list[str], n: int) -> None:
        """Tag groups finished once their tool calls returned (``n`` trajectories each)."""
        ray.get(self.tq.set_tags.remote(partition, {k: dict(FINISHED) for k in keys}))
        self._hand_off(partition, keys, n)

    def _hand_off(self, partition: str, groups: list[str], n: int, after: list[Any] | None = None) -> None:
        """Hand finished groups to the reward and the teacher workers that score them in the
        background (each pool's own owners; ``after``: the queue writes that finished them)."""
        self.scoring.hand_off(partition, groups, n, after)
        self.teaching.hand_off(partition, groups, n, after)

    def _generate(
        self,
        partition: str,
        prompt_keys: list[str],
        n: int,
        params: dict[str, Any],
        engine: RolloutEngine | None = None,
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
        batch = RolloutBatch(partition, n, with_tools=self.tool_latency is not None and partition == "train")
        try:
            self._run_loops(batch, prompt_keys, params, engine or self.turns, more)
        except Exception:
            failed = {k: {"status": "failure"} for k in batch.failed_keys(prompt_keys)}
            ray.get([*batch.writes, self.tq.set_tags.remote(partition, failed)])
            raise
        return self._write_batch(batch)

    def _run_loops(
        self,
        batch: RolloutBatch,
        prompt_keys: list[str],
        params: dict[str, Any],
        engine: RolloutEngine,
        more: More | None,
    ) -> None:
        """Hand the batch's starts to their agent loops, one loop's at a time, until none is left
        (groups ``more`` takes in while a loop runs may add starts for other loops)."""
        batch.pending = self._take(batch, prompt_keys)
        sampling = SamplingParams(**params)
        on_done = partial(self._on_done, batch)
        while batch.pending:
            loop = next(iter(batch.pending))
            starts = batch.pending.pop(loop)
            admit = partial(self._admit, batch, loop, more) if more is not None else None
            batch.results += AGENT_LOOPS.get(loop)(
                engine, starts, sampling, self.agent, self.loop.stopping, on_done, admit
            )

    def _take(self, batch: RolloutBatch, keys: list[str]) -> dict[str, list[Start]]:
        """Tag ``keys`` running and take them into the batch; their trajectories' starts, by agent loop."""
        partition = batch.partition
        prompts, prompt_tags, _ = ray.get(
            [
                self.tq.get.remote(partition, keys),
                self.tq.get_tags.remote(partition, keys),
                self.tq.set_tags.remote(partition, {k: {"status": "running"} for k in keys}),
            ]
        )
        batch.taken.extend(keys)
        batch.earlier.update(self._partials(partition, keys, prompt_tags, batch.n))
        loops = [self.agent.loop_for(prompt) for prompt in prompts]
        return batch.add_groups(keys, prompts, loops, [self.encode_prompt(p["prompt"]) for p in prompts])

    def _on_done(self, batch: RolloutBatch, trajectory: AgentTrajectory) -> None:
        """A trajectory ended (called by the loops on this thread): its group is written at once
        when that completes it."""
        group = batch.end(trajectory)
        if group is None:
            return
        key = group_of(trajectory.request_id)
        records, tags = self._records(group.ended, batch, False)
        batch.writes.append(self.tq.put.remote(batch.partition, records, tags))
        batch.writes.append(self.tq.set_tags.remote(batch.partition, {key: dict(FINISHED)}))
        group.written = True
        batch.written_early.append(key)
        self._hand_off(batch.partition, [key], batch.n, batch.writes[-2:])

    def _admit(self, batch: RolloutBatch, loop: str, more: More) -> list[Start]:
        """More queued groups, while the batch has room for them: the starts of those ``loop``
        answers (the others wait for their own loop's turn)."""
        if not self.loop.queued():  # asked every poll: the common answer, cheaply
            return []
        new = more(self.loop.max_groups_per_batch - batch.unfinished_groups())
        if not new:
            return []
        starts = self._take(batch, new)
        for other, other_starts in starts.items():
            if other != loop:
                batch.pending.setdefault(other, []).extend(other_starts)
        return starts.get(loop, [])

    def _write_batch(self, batch: RolloutBatch) -> tuple[list[str], list[str], dict[str, float]]:
        """Write the trajectories not written early and tag every group; what ``_generate`` returns."""
        records, tags = self._records(batch.unwritten_results(), batch, batch.with_tools)
        batch.writes.append(self.tq.put.remote(batch.partition, records, tags))
        unfinished, tool_deadlines, status = batch.final_tags(records, tags)
        batch.writes.append(self.tq.set_tags.remote(batch.partition, status))
        finished = [k for k, t in status.items() if t.get("status") == "finished"]
        self._hand_off(batch.partition, finished, batch.n, batch.writes[-2:])
        ray.get(batch.writes)
        return batch.early_keys() + list(records), unfinished, tool_deadlines

    def _records(
        self, results: list[AgentTrajectory], batch: RolloutBatch, with_tools: bool
    ) -> tuple[dict[str, Record], dict[str, Record]]:
        """The queue records and tags of finished trajectories (R-5.6): a continued single turn
        keeps its earlier tokens' log-probs and versions; a multi-turn one adds its mask and turns."""
        records, tags = {}, {}
        self._generated_tokens += sum(  # sampled now: not a prefix given back, nor tool answers
            sum(result.response_mask) if result.response_mask else len(result.log_probs) for result in results
        )
        for result in results:
            key = group_of(result.request_id)
            group = batch.groups[key]
            fresh = group.loop != SINGLE_TURN
            old = (None if fresh else batch.earlier.get(result.request_id)) or {"rollout_log_probs": [], "token_versions": []}
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
                "data_source": group.prompt["data_source"],
                "ground_truth": group.prompt["ground_truth"],
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
        tokens, self._generated_tokens = self._generated_tokens, 0
        return {
            **self.turns.pop_counts(),
            "groups_awaiting_tools": float(self.tool_calls.pending()),
            "generated_tokens": float(tokens),
        }

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

    def open_receiver(self, backend: WeightSyncBackend, descriptor: dict[str, Any]) -> None:
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
                self.engine.close()

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
