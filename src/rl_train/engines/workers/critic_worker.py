"""A critic rank: the value model of one DP rank of the critic pool (R-3.1 steps 6 and 8).

It reads its share of a batch from the TransferQueue and writes back only per-token lists
over the response: ``values`` (V_old, the values phase) for the advantage phase's GAE, which
writes ``returns``; the critic update then fits the values to those returns with the clipped
value loss. The critic ranks form their own torch.distributed group, apart from the trainer's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ray

from rl_train.engines.node_address import node_address
from rl_train.engines.training.critic_config import CriticConfig
from rl_train.engines.workers.host_memory import keep_freed_memory
from rl_train.storage.checkpoint import CheckpointStore, PartEntry

if TYPE_CHECKING:  # bound for real by ``_import_engine_side``, in the actor's process only
    import torch

    from rl_train.algorithms.critic_loss import build_critic_loss_fn, explained_variance
    from rl_train.engines.training.critic_protocol import ValueEngine
    from rl_train.engines.training.value_engine import TorchValueEngine
    from rl_train.engines.workers.checkpoint_io import (
        CheckpointSnapshot,
        clone_state,
        rng_state,
        set_rng_state,
    )
    from rl_train.engines.workers.rendezvous import join_world
    from rl_train.storage.records import collate, scatter_response

TRAJECTORY_FIELDS = ["prompt_ids", "response_ids"]
UPDATE_FIELDS = ["values", "returns"]
"""Per-token fields the update reads: V_old (values phase) and the returns (advantage phase)."""


def _import_engine_side() -> None:
    """Bind what this actor's methods use and the driver never does, as module globals, in
    the actor's process only (``__init__`` calls this first). The driver imports this module
    for the class, to create the actor; with these at the top it would import torch (about
    3 s of CPU at every start, on the cores the run's other processes start on) for a
    process that never touches a tensor. ``tests/unit/test_driver_imports.py`` holds it."""
    global torch, build_critic_loss_fn, explained_variance, TorchValueEngine, CheckpointSnapshot, clone_state
    global rng_state, set_rng_state, join_world, collate, scatter_response
    import torch

    from rl_train.algorithms.critic_loss import build_critic_loss_fn, explained_variance
    from rl_train.engines.training.value_engine import TorchValueEngine
    from rl_train.engines.workers.checkpoint_io import (
        CheckpointSnapshot,
        clone_state,
        rng_state,
        set_rng_state,
    )
    from rl_train.engines.workers.rendezvous import join_world
    from rl_train.storage.records import collate, scatter_response


class CriticWorker:
    def __init__(
        self,
        rank: int,
        world_size: int,
        model_path: str,
        critic: dict[str, Any],
        seed: int,
        tq: Any,
        dist_address: str | None = None,
    ) -> None:
        keep_freed_memory()  # before the model: its tensors' pages stay the process's
        _import_engine_side()
        self.cfg = CriticConfig.model_validate(critic)
        torch.set_num_threads(self.cfg.num_threads)
        torch.set_flush_denormal(True)  # denormal floats in a tiny model slow CPU kernels 10x
        self.rank, self.world_size = rank, world_size
        self._engine_args = (model_path, seed)
        self._engine: ValueEngine | None = None
        self.loss_fn = build_critic_loss_fn(self.cfg)
        self.tq = tq
        self._checkpoint: CheckpointSnapshot | None = None
        if world_size == 1 or dist_address is not None:
            self.start(dist_address)

    @property
    def engine(self) -> ValueEngine:
        """The value engine (built by ``start``)."""
        if self._engine is None:
            raise RuntimeError(f"critic rank {self.rank}: start() builds the engine, and has not run")
        return self._engine

    def rendezvous_address(self) -> str:
        """(rank 0) Where this pool's world meets: an address on this rank's node."""
        return node_address()

    def start(self, dist_address: str | None) -> None:
        """Join the pool's world at ``dist_address`` (with several ranks), then build the engine."""
        if self._engine is not None:
            return
        if self.world_size > 1:
            assert dist_address is not None, "a rank of several needs the pool's rendezvous address"
            join_world(dist_address, self.rank, self.world_size)
        model_path, seed = self._engine_args
        self._engine = TorchValueEngine(model_path, self.cfg, seed)
        self.pad_token_id = int(self._engine.tokenizer.pad_token_id)

    def compute_values(self, partition: str, keys: list[str]) -> int:
        """(6) V_old of every response token of ``keys``, written as ``values`` on each record."""
        if not keys:
            return 0
        records = ray.get(self.tq.get.remote(partition, keys, TRAJECTORY_FIELDS))
        values = scatter_response(self.engine.compute_values(collate(records, self.pad_token_id)), records)
        ray.get(self.tq.put.remote(partition, {k: {"values": v} for k, v in zip(keys, values, strict=True)}))
        return len(keys)

    def update(self, partition: str, keys: list[str], num_mini_batches: int) -> dict[str, float]:
        """(8) ppo_epochs x num_mini_batches critic steps over this rank's share of the batch.

        Every rank runs the same number of steps (each all-reduces), fixed by the driver.
        Whole records are read, so an RS-edited ``response_mask`` masks the value loss too.
        """
        records = ray.get(self.tq.get.remote(partition, keys)) if keys else []
        missing = [f for f in UPDATE_FIELDS if records and f not in records[0]]
        if missing:
            raise KeyError(
                f"critic update needs per-token field(s) {missing}; the earlier phases did not write them"
            )
        sums: dict[str, float] = {}
        steps = 0
        for _ in range(self.cfg.ppo_epochs or 1):  # None only outside a run config (resolved there)
            for part in range(num_mini_batches):
                chunk = records[part::num_mini_batches] if num_mini_batches > 1 else records
                batch = collate(chunk, self.pad_token_id, UPDATE_FIELDS)
                for key, value in self.engine.train_batch(batch, self.loss_fn).items():
                    sums[key] = sums.get(key, 0.0) + value
                steps += 1
        metrics = {key: value / max(steps, 1) for key, value in sums.items()}
        if records:
            batch = collate(records, self.pad_token_id, UPDATE_FIELDS)
            mask = batch["response_mask"]
            metrics["critic/vf_explained_var"] = explained_variance(batch["values"], batch["returns"], mask)
            metrics["critic/returns_mean"] = float((batch["returns"] * mask).sum() / mask.sum().clamp(min=1))
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return self.engine.state_dict()

    # -- checkpoint: as a trainer rank's, without the policy directory ----------
    def snapshot_checkpoint(self, with_policy: bool = False) -> None:
        self._checkpoint = CheckpointSnapshot(clone_state(self.engine.state_dict()), clone_state(rng_state()))

    def write_checkpoint(self, root: str, step: int, storage_options: dict[str, Any] | None) -> list[PartEntry]:
        snapshot, self._checkpoint = self._checkpoint, None
        if snapshot is None:
            raise RuntimeError(f"critic rank {self.rank}: write_checkpoint({step}) without a snapshot")
        return snapshot.write(CheckpointStore(root, storage_options=storage_options), step, f"critic/rank-{self.rank}")

    def load_checkpoint(self, root: str, step: int, storage_options: dict[str, Any] | None) -> None:
        store = CheckpointStore(root, storage_options=storage_options)
        self.engine.load_state_dict(store.read_state(step, f"critic/rank-{self.rank}/engine"))
        set_rng_state(store.read_state(step, f"critic/rank-{self.rank}/rng"))

    def ping(self) -> int:
        return self.rank
