"""A training rank: the policy (and frozen reference) engines of one DP rank (R-4)."""

from __future__ import annotations

import shutil
import threading
from typing import TYPE_CHECKING, Any

import fsspec
import ray

from rl_train.algorithms.policy_loss import POLICY_LOSSES
from rl_train.algorithms.teacher_fields import TOPK_FIELDS, teacher_fields
from rl_train.engines.node_address import node_address
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.nonfinite import NonFiniteStepGuard
from rl_train.engines.weight_sync.adapters import sends_adapters
from rl_train.engines.weight_sync.base import NamedTensors, WeightSender, WeightSyncBackend
from rl_train.engines.workers.host_memory import freeze_built_objects, keep_freed_memory
from rl_train.engines.workers.placement import check_device
from rl_train.owned_tmp import owned_dir
from rl_train.storage.checkpoint import CheckpointStore, PartEntry

if TYPE_CHECKING:  # bound for real by ``_import_engine_side``, in the actor's process only
    import torch

    from rl_train.algorithms.actor_loss import build_actor_loss_fn
    from rl_train.engines.rollout.protocol import RolloutEngine
    from rl_train.engines.training.protocol import TrainingEngine
    from rl_train.engines.training.registry import build_training_engine
    from rl_train.engines.training.router_replay import RouterReplay, build_router_replay
    from rl_train.engines.weight_sync.boundaries import run_sender
    from rl_train.engines.workers.checkpoint_io import (
        CheckpointSnapshot,
        clone_state,
        rng_state,
        set_rng_state,
    )
    from rl_train.engines.workers.rendezvous import join_world
    from rl_train.engines.workers.rollout_worker import RolloutWorker
    from rl_train.storage.records import collate, require_response_fields, scatter_response

TRAJECTORY_FIELDS = ["prompt_ids", "response_ids"]
FREEZE_TIMEOUT_SECONDS = 600.0
"""How long a push waits for its frozen copy (the main thread may be busy with an update)."""
POLICY_SNAPSHOT_PREFIX = "rlt-policy-"
"""The policy copied for a checkpoint between updates; a killed trainer's is swept by the next (``owned_tmp``)."""
OPTIONAL_TOKEN_FIELDS = ["rollout_is_weights"]
"""Per-token fields the advantage phase writes only when configured (IS weights multiply the policy loss)."""


def _import_engine_side() -> None:
    """Bind what this actor's methods use and the driver never does, as module globals, in
    the actor's process only (``__init__`` calls this first). The driver imports this module
    for the class, to create the actor; with these at the top it would import torch (about
    3 s of CPU at every start, on the cores the run's other processes start on) for a
    process that never touches a tensor. ``tests/unit/test_driver_imports.py`` holds it."""
    global torch, build_actor_loss_fn, build_training_engine, run_sender, CheckpointSnapshot, clone_state, rng_state
    global set_rng_state, join_world, collate, scatter_response, build_router_replay, require_response_fields
    import torch

    from rl_train.algorithms.actor_loss import build_actor_loss_fn
    from rl_train.engines.training.registry import build_training_engine
    from rl_train.engines.training.router_replay import build_router_replay
    from rl_train.engines.weight_sync.boundaries import run_sender
    from rl_train.engines.workers.checkpoint_io import (
        CheckpointSnapshot,
        clone_state,
        rng_state,
        set_rng_state,
    )
    from rl_train.engines.workers.rendezvous import join_world
    from rl_train.storage.records import collate, require_response_fields, scatter_response


class NotStartedError(RuntimeError):
    """A rank of several was called before ``start`` joined its world and built its engines."""


class TrainerWorker:
    def __init__(
        self,
        rank: int,
        world_size: int,
        model_path: str,
        actor: dict[str, Any],
        horizon_steps: int,
        temperature: float,
        seed: int,
        tq: Any,
        dist_address: str | None = None,
        with_reference: bool = False,
        tool_env: dict[str, Any] | None = None,
        rollout_engine: str = "torch",
        rollout_options: dict[str, Any] | None = None,
        model_impl: str = "auto",
        agent: dict[str, Any] | None = None,
        sandbox: dict[str, Any] | None = None,
    ) -> None:
        """``rollout_engine`` (with ``rollout_options``), ``tool_env``: what the spare rescue
        engine is built as and meets. With several ranks and no ``dist_address`` the rank
        waits for ``start`` (the pools pass rank 0's ``rendezvous_address`` to every rank).
        ``model_impl``: the torch engine's model code (``model.impl``); ``agent``: the
        ``rollout.agent`` dump the spare rescue engine answers prompts with, and ``sandbox`` the
        run's ``sandbox`` dump its tools run untrusted code under."""
        keep_freed_memory()  # before the model: its tensors' pages stay the process's
        _import_engine_side()
        self.cfg = ActorConfig.model_validate(actor)
        torch.set_num_threads(self.cfg.num_threads)
        torch.set_flush_denormal(True)  # denormal floats in a tiny model slow CPU kernels 10x
        self.rank, self.world_size = rank, world_size
        self._engine_args = (model_path, horizon_steps, temperature, seed, with_reference)
        self._with_reference = with_reference
        self.model_impl = model_impl
        self.agent = agent
        self.sandbox = sandbox
        # the model is split over the ranks (megatron TP/PP, or FSDP shards): exports are collectives
        split = self.cfg.megatron.tensor_parallel_size * self.cfg.megatron.pipeline_parallel_size
        self._split_model = split > 1 or (self.cfg.fsdp and world_size > 1)
        self._engine: TrainingEngine | None = None
        self.reference: TrainingEngine | None = None
        self._router_replay: RouterReplay | None = None
        self.loss_fn = build_actor_loss_fn(self.cfg)
        self.nonfinite = NonFiniteStepGuard(self.cfg.max_nonfinite_steps_in_row)
        self.tq = tq
        self.sender: WeightSender | None = None
        self.model_path, self.seed = model_path, seed
        self.spare: RolloutWorker | None = None
        self.tool_env, self.rollout_engine, self.rollout_options = tool_env, rollout_engine, rollout_options
        self._frozen: tuple[int, list[tuple[str, torch.Tensor]]] = (-1, [])
        self._frozen_ready = threading.Condition()
        self._checkpoint: CheckpointSnapshot | None = None
        if world_size == 1 or dist_address is not None:
            self.start(dist_address)

    @property
    def engine(self) -> TrainingEngine:
        """The policy engine (built by ``start``)."""
        if self._engine is None:
            raise NotStartedError(f"trainer rank {self.rank}: start() builds the engines, and has not run")
        return self._engine

    @property
    def router_replay(self) -> RouterReplay:
        """How the actor's passes route an MoE model's tokens (``actor.router_replay``), chosen
        by ``start`` once the engine can say whether it replays routes."""
        if self._router_replay is None:
            raise NotStartedError(f"trainer rank {self.rank}: start() builds the engines, and has not run")
        return self._router_replay

    def where(self) -> dict[str, str]:
        """The node this actor runs on: Ray's id and address of it."""
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address()}

    def data_parallel_rank(self) -> int:
        """This rank's data-parallel index: the ranks that split one model (tensor or pipeline
        parallel) share it, and the batch shard that goes with it."""
        return self.engine.data_parallel_rank

    def join_export(self, sync: bool = False) -> None:
        """Take part in rank 0's export of a split model (a weight sync, a saved policy): the
        export gathers over the tensor and pipeline groups (or the FSDP shards), so every rank
        runs it together. ``sync``: rank 0 exports what a weight sync sends (``export_for_sync``:
        with LoRA, possibly the adapters alone, whose gathers differ from the whole policy's)."""
        for _ in self.export_for_sync() if sync else self.engine.export_weights():
            pass

    def rendezvous_address(self) -> str:
        """(rank 0) Where this pool's world meets: an address on this rank's node."""
        return node_address()

    def start(self, dist_address: str | None) -> None:
        """Join the pool's world at ``dist_address`` (with several ranks), then build the engines
        (a megatron engine sets its groups up in that world)."""
        if self._engine is not None:
            return
        if self.world_size > 1:
            assert dist_address is not None, "a rank of several needs the pool's rendezvous address"
            # tensors on CUDA meet over NCCL (megatron takes CUDA whenever it is there), host ones over gloo
            on_gpu = self.cfg.device == "cuda" or (self.cfg.engine == "megatron" and torch.cuda.is_available())
            join_world(dist_address, self.rank, self.world_size, "nccl" if on_gpu else "gloo")
        model_path, horizon_steps, temperature, seed, with_reference = self._engine_args
        check_device(self.cfg.device, "actor.device")
        self._engine = build_training_engine(
            self.cfg.engine, model_path, self.cfg, horizon_steps, temperature, seed, model_impl=self.model_impl
        )
        self._router_replay = build_router_replay(self.cfg.router_replay, self._engine, self.cfg.engine)
        # with LoRA the reference is the policy's own base (adapters off): no second engine
        self.reference = (
            build_training_engine(
                self.cfg.engine, model_path, self.cfg, horizon_steps, temperature, seed, model_impl=self.model_impl
            )
            if with_reference and not self._engine.reference_is_base
            else None
        )
        self.pad_token_id = int(self._engine.tokenizer.pad_token_id)
        freeze_built_objects()  # the engines' objects leave the collector's full passes

    def _records(self, partition: str, keys: list[str], fields: list[str]) -> list[dict[str, Any]]:
        return ray.get(self.tq.get.remote(partition, keys, TRAJECTORY_FIELDS + fields)) if keys else []

    def compute_log_probs(
        self, partition: str, keys: list[str], out_field: str, reference: bool = False
    ) -> int:
        """Forward-only pass (old_log_prob or ref); writes ``out_field`` on each record. A rank
        of a split model runs even with no key: its passes are collectives with the others'."""
        if not keys and not self._split_model:
            return 0
        base = reference and self.engine.reference_is_base
        engine: TrainingEngine | None = self.reference if reference and not base else self.engine
        assert engine is not None and (self._with_reference or not reference), "built without a reference model"
        if out_field == "old_log_probs":  # pi_old's pass: its routing is the router-replay strategy's
            records = self._records(partition, keys, self.router_replay.old_log_prob_fields())
            log_probs, extra = self.router_replay.old_log_probs(engine, collate(records, self.pad_token_id), records)
        else:
            records = self._records(partition, keys, [])
            log_probs = engine.compute_log_probs(collate(records, self.pad_token_id), base=base)["log_probs"]
            extra = [{} for _ in records]
        values = scatter_response(log_probs, records)
        fields = [{out_field: value, **more} for value, more in zip(values, extra, strict=True)]
        if keys:
            ray.get(self.tq.put.remote(partition, dict(zip(keys, fields, strict=True))))
        return len(keys)

    def update(self, partition: str, keys: list[str], num_mini_batches: int) -> dict[str, float]:
        """ppo_epochs x num_mini_batches optimizer steps over this rank's share of the batch.

        Every rank must run the same number of steps (they all-reduce each one), so the
        driver fixes ``num_mini_batches`` for all ranks. Metrics are means over the steps,
        except ``actor/nonfinite_steps`` (the steps skipped for a NaN/inf grad norm, a count)
        and ``actor/nonfinite_steps_in_row``; too many in a row raise ``NonFiniteStepsError``.
        """
        reads_advantages = POLICY_LOSSES[self.cfg.policy_loss].reads_advantages
        fields = ["old_log_probs"] + (["advantages"] if reads_advantages else [])
        fields += ["ref_log_probs"] if self.cfg.kl_loss else []
        # Whole records: collate also reads the RS-edited response_mask when the advantage phase wrote one.
        records = ray.get(self.tq.get.remote(partition, keys)) if keys else []
        missing = [f for f in TRAJECTORY_FIELDS + fields if records and f not in records[0]]
        if missing:
            raise KeyError(
                f"update needs per-token field(s) {missing}; the earlier phases did not write them"
            )
        replay: RouterReplay = self.router_replay
        replay.check_update_records(records)
        fields += [f for f in OPTIONAL_TOKEN_FIELDS if records and f in records[0]]
        # a distillation loss's teacher scores: every graded token has one, or the update stops
        teacher = teacher_fields(self.cfg.policy_loss, self.cfg.distill_term)
        topk = [f for f in teacher if f in TOPK_FIELDS]
        per_token = [f for f in teacher if f not in TOPK_FIELDS]
        fields += per_token
        if teacher:
            records = require_response_fields(records, keys, per_token, topk)
        sums: dict[str, float] = {}
        steps = 0
        batches = []  # collated once: every epoch trains on the same mini-batches
        for part in range(num_mini_batches):
            chunk = records[part::num_mini_batches] if num_mini_batches > 1 else records
            batch = collate(chunk, self.pad_token_id, fields, topk)
            replay.route_update(batch, chunk)
            batches.append(batch)
        for _ in range(self.cfg.ppo_epochs):
            for batch in batches:
                step_metrics = self.engine.train_batch(batch, self.loss_fn)
                for key, value in step_metrics.items():
                    sums[key] = sums.get(key, 0.0) + float(value)
                steps += 1
                self.nonfinite.record(float(step_metrics["actor/nonfinite_steps"]) > 0)
        metrics = {key: value / max(steps, 1) for key, value in sums.items()}
        metrics["actor/nonfinite_steps"] = sums.get("actor/nonfinite_steps", 0.0)
        metrics["actor/nonfinite_steps_in_row"] = float(self.nonfinite.in_row)
        metrics.update(replay.update_metrics(batches, self.cfg.ppo_epochs))
        return metrics

    # -- weights ------------------------------------------------------------------------
    def open_sender(self, backend: WeightSyncBackend) -> dict[str, Any]:
        self.sender = backend.build_sender()
        return self.sender.descriptor()

    @property
    def sends_adapters(self) -> bool:
        """Whether a weight sync sends the LoRA adapters alone (``weight_sync.adapters``): LoRA
        trains, ``actor.lora.sync`` is ``adapter`` and the rollout engine serves adapters."""
        return sends_adapters(self.cfg.lora, self.rollout_engine)

    def export_for_sync(self) -> NamedTensors:
        """What a weight sync sends: the adapters alone, or the HF-named full weights."""
        return self.engine.export_adapters() if self.sends_adapters else self.engine.export_weights()

    def freeze_weights(self, version: int) -> None:
        """Copy the weights to send as ``version``, so the updates after this call cannot change them.

        Runs in the main thread, in order with ``update``; ``send_weights(version, frozen=True)``,
        in the weight-sync thread, waits for it and sends the copy while training goes on."""
        frozen = [(name, tensor.detach().clone()) for name, tensor in self.export_for_sync()]
        with self._frozen_ready:
            self._frozen = (version, frozen)
            self._frozen_ready.notify_all()

    def send_weights(self, version: int, frozen: bool = False) -> tuple[Any, dict[str, float]]:
        """Export and transport the weights as ``version``: the live ones, or the frozen copy."""
        assert self.sender is not None, "open_sender() first"
        if not frozen:
            return run_sender(self.sender, self.export_for_sync, version)
        with self._frozen_ready:
            if not self._frozen_ready.wait_for(lambda: self._frozen[0] == version, FREEZE_TIMEOUT_SECONDS):
                raise TimeoutError(f"weights of version {version} were never frozen for sending")
            tensors, self._frozen = self._frozen[1], (-1, [])
        return run_sender(self.sender, lambda: iter(tensors), version)

    def close_sender(self) -> None:
        """Release the sender's shared memory, sockets and registrations (idempotent)."""
        sender, self.sender = self.sender, None
        if sender is not None:
            sender.close()

    # -- separate_async: pi_old slot and the spare rollout engine ----------------------
    def snapshot_pi_old(self) -> None:
        """Slot 0 (R-2.8): old_log_prob uses these weights until ``clear_pi_old``."""
        self.engine.snapshot_pi_old()

    def clear_pi_old(self) -> None:
        self.engine.clear_pi_old()

    def rescue_generate(
        self, partition: str, prompt_keys: list[str], n: int, params: dict[str, Any], version: int
    ) -> list[str]:
        """Starvation rescue (R-2.7): the co-located spare engine, loaded in place with the
        current weights, generates the prompts into the queue, then sleeps again."""
        from rl_train.engines.workers.rollout_worker import RolloutWorker

        if self.spare is None:
            self.spare = RolloutWorker(
                self.model_path,
                self.tq,
                self.seed + 7919,
                self.cfg.num_threads,
                self.tool_env,
                engine=self.rollout_engine,
                engine_options=self.rollout_options,
                agent=self.agent,
                rescue=True,
                sandbox=self.sandbox,
            )
        spare = self.spare
        spare.wake_up()
        try:
            spare_engine: RolloutEngine = spare.engine
            spare_engine.update_weights(self.engine.export_weights(), version)
            return spare.generate_prompts(partition, prompt_keys, n, params)
        finally:
            spare.sleep()

    def state_dict(self) -> dict[str, Any]:
        return self.engine.state_dict()

    # -- checkpoint (R-9.2, R-9.5) -------------------------------------------------------
    def snapshot_checkpoint(self, with_policy: bool) -> None:
        """Between updates: copy this rank's state to host memory (and, on rank 0 with
        ``with_policy``, the policy to a local HF directory), so the write can run beside the
        next update (``write_checkpoint``, in the checkpoint group)."""
        self._drop_checkpoint_snapshot()
        policy_dir = None
        if with_policy and self.rank == 0:
            policy_dir = owned_dir(POLICY_SNAPSHOT_PREFIX)
            self.engine.save_pretrained(policy_dir)
        elif with_policy and self._split_model:
            self.join_export()  # rank 0's save gathers the model from every rank
        self._checkpoint = CheckpointSnapshot(
            state=clone_state(self.engine.state_dict()),
            rng=clone_state(rng_state()),
            nonfinite_in_row=self.nonfinite.in_row,
            policy_dir=policy_dir,
        )

    def write_checkpoint(self, root: str, step: int, storage_options: dict[str, Any] | None) -> list[PartEntry]:
        """Write the last snapshot's parts into checkpoint ``step``; returns their entries."""
        snapshot = self._checkpoint
        if snapshot is None:
            raise RuntimeError(f"trainer rank {self.rank}: write_checkpoint({step}) without a snapshot")
        try:
            return snapshot.write(CheckpointStore(root, storage_options=storage_options), step, f"actor/rank-{self.rank}")
        finally:
            self._drop_checkpoint_snapshot()

    def load_checkpoint(self, root: str, step: int, storage_options: dict[str, Any] | None) -> None:
        store = CheckpointStore(root, storage_options=storage_options)
        prefix = f"actor/rank-{self.rank}"
        self.engine.load_state_dict(store.read_state(step, f"{prefix}/engine"))
        set_rng_state(store.read_state(step, f"{prefix}/rng"))
        self.nonfinite.in_row = int(store.read_json(step, f"{prefix}/worker.json")["nonfinite_in_row"])

    def export_policy(self, uri: str) -> list[str]:
        """Write the current policy as an HF model directory at ``uri`` (a path or s3:// URI,
        R-9.5); returns the files written."""
        fs, root = fsspec.core.url_to_fs(uri)
        tmp = owned_dir(POLICY_SNAPSHOT_PREFIX)
        try:
            self.engine.save_pretrained(tmp)
            files = sorted(p for p in tmp.rglob("*") if p.is_file())
            fs.makedirs(root, exist_ok=True)
            for folder in sorted({p.parent for p in files} - {tmp}):  # a LoRA policy's adapter/
                fs.makedirs(f"{root.rstrip('/')}/{folder.relative_to(tmp).as_posix()}", exist_ok=True)
            for path in files:
                fs.put_file(str(path), f"{root.rstrip('/')}/{path.relative_to(tmp).as_posix()}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return [path.relative_to(tmp).as_posix() for path in files]

    def _drop_checkpoint_snapshot(self) -> None:
        snapshot, self._checkpoint = self._checkpoint, None
        if snapshot is not None and snapshot.policy_dir is not None:
            shutil.rmtree(snapshot.policy_dir, ignore_errors=True)

    def ping(self) -> int:
        return self.rank

