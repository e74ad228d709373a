"""The run's TransferQueue actor, and the phases that run where the records live.

The advantage phase (rollout correction, token rewards, advantages), bypass mode's copy of
the rollout log-probs and the DP balance only read and write records; running them here
means only batch ids cross the driver. The actor also keeps the run's resolved config, so a
fresh process can rejoin every pool from the run id (``WorkerPools.join``), and the
advantage phase's state across steps (the adaptive KL coefficient, the runbook trends).

ReMax's greedy baseline stages its prompts here too: the batch's prompts are copied into
the ``greedy`` partition, the rollout pool answers each once, greedily, the reward pool scores
the answers there, and each trajectory of the batch receives its prompt's score as
``baseline_reward``. The greedy answers are then deleted: they are never part of a batch.

Every process that is handed this actor's handle (each rollout, trainer and reward worker)
imports this module, since Ray rebuilds a handle from its class. The modules that need torch
or pyarrow (the advantage phase, the checkpoint store, the table codec) are therefore imported
where they are used, in this actor only: at module level they cost every worker about a
second of start-up CPU.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from rl_train.algorithms.balance import partition_by_tokens
from rl_train.engines.agent.metrics import agent_metrics
from rl_train.engines.workers.background_build import BackgroundBuild
from rl_train.storage.transfer_queue import PARTITIONS, TransferQueue

if TYPE_CHECKING:
    from rl_train.storage.checkpoint_manifest import PartEntry

CHECKPOINT_PARTITIONS = ("train",)
"""What a checkpoint keeps: validation and greedy records live within one phase."""
GREEDY_PARTITION = "greedy"
"""ReMax's greedy answers: generated, scored and deleted within one phase, never trained on."""


class QueueWorker(TransferQueue):
    def __init__(self, run_config: dict[str, Any]) -> None:
        super().__init__((*PARTITIONS, GREEDY_PARTITION))
        from rl_train.algorithms.config import AlgorithmConfig

        self._run_config = run_config
        self._algorithm = AlgorithmConfig.model_validate(run_config["algorithm"])  # fails now if malformed
        self._advantage_phase = BackgroundBuild(self._build_advantage_phase)
        self._restored_advantage: dict[str, Any] | None = None
        """A checkpoint's advantage state read before the phase was built (applied when it is)."""
        self._advantage_built: Any = None
        self._restore_lock = threading.Lock()
        self._handover = False

    def _build_advantage_phase(self) -> Any:
        from rl_train.algorithms.advantage_phase import AdvantagePhase  # torch: about 1.2 s of CPU

        gar = (self._run_config.get("reward") or {}).get("gar") or {}  # groupwise grading
        threshold = float(gar["pass_threshold"]) if gar.get("grader") else None
        phase = AdvantagePhase.from_config(self._algorithm, threshold)
        with self._restore_lock:
            if self._restored_advantage is not None:
                phase.load_state_dict(self._restored_advantage)
                self._restored_advantage = None
            self._advantage_built = phase
        return phase

    @property
    def _advantage(self) -> Any:
        """The advantage phase, built at first use or by ``warm_up``'s thread."""
        return self._advantage_phase.get()

    def warm_up(self) -> None:
        """Build the advantage phase on a thread (it imports torch), while the first batch is
        generated; this actor answers meanwhile. Start-up of the pools does not wait for it."""
        self._advantage_phase.start()

    def run_config(self) -> dict[str, Any]:
        """The run's resolved config, as data (what a rejoining process rebuilds its view from)."""
        return self._run_config

    def set_weight_sync_handover(self, handover: bool) -> None:
        self._handover = handover

    def weight_sync_handover(self) -> bool:
        return self._handover

    # -- checkpoint (R-9.1 - R-9.3) ---------------------------------------------------------
    def save_checkpoint(self, root: str, step: int, storage_options: dict[str, Any] | None) -> list[PartEntry]:
        """The train partition (every record's fields and tags, prompts in flight included) as
        one Parquet table, and the advantage phase's state. Taken in one actor call, so no
        rollout write lands half-way through it."""
        from rl_train.storage.checkpoint import CheckpointStore
        from rl_train.storage.tq_table import records_to_table

        store = CheckpointStore(root, storage_options=storage_options)
        table = records_to_table(self.export_records(CHECKPOINT_PARTITIONS))
        return [
            store.write_table(step, "queue/records.parquet", table),
            store.write_json(step, "queue/algorithm.json", self._advantage.state_dict()),
        ]

    def load_checkpoint(
        self, root: str, step: int, storage_options: dict[str, Any] | None, version: int
    ) -> list[str]:
        """Restore the saved records; the prompts that were in flight go back to pending without
        their partial trajectories (``requeue_in_flight``). Returns those prompt keys."""
        from rl_train.storage.checkpoint import CheckpointStore
        from rl_train.storage.tq_table import requeue_in_flight, table_to_records

        store = CheckpointStore(root, storage_options=storage_options)
        rows, requeued = requeue_in_flight(table_to_records(store.read_table(step, "queue/records.parquet")), version)
        self.import_records(rows)
        state = store.read_json(step, "queue/algorithm.json")
        with self._restore_lock:  # a resume need not wait for the phase's torch import
            built = self._advantage_built
            if built is None:
                self._restored_advantage = state
        if built is not None:
            built.load_state_dict(state)
        return requeued

    # -- phases ------------------------------------------------------------------------------
    def balance_batch(self, batch_id: str, num_ranks: int) -> dict[str, float]:
        """(3) Split the batch across DP ranks with even token counts; stores the shards."""
        batch = self.get_batch(batch_id)
        keys = batch["keys"]
        tags = self.get_tags(batch["partition"], keys)
        lengths = [t["prompt_len"] + t["response_len"] for t in tags]
        shards = partition_by_tokens(keys, lengths, num_ranks)
        self.update_batch(batch_id, shards=shards)
        length_of = dict(zip(keys, lengths, strict=True))
        response_lengths = [t["response_len"] for t in tags]
        return {
            "response_length/mean": sum(response_lengths) / max(len(response_lengths), 1),
            "balance/max_rank_tokens": float(max((sum(length_of[k] for k in s) for s in shards), default=0)),
        }

    def copy_rollout_log_probs(self, batch_id: str) -> None:
        """(4, bypass_mode, R-7.1) old_log_probs := the rollout engine's log-probs."""
        from rl_train.algorithms.advantage_phase import bypass_old_log_probs

        batch = self.get_batch(batch_id)
        keys, partition = batch["keys"], batch["partition"]
        values = bypass_old_log_probs(self.get(partition, keys))
        self.put(partition, {k: {"old_log_probs": v} for k, v in zip(keys, values, strict=True)})

    def copy_current_log_probs(self, batch_id: str) -> tuple[list[list[str]], dict[str, float]]:
        """(4, ``bypass_current_version``) old_log_probs := the rollout log-probs of each
        trajectory sampled wholly by pi_old's weights: version ``step - 1``, the weights local
        update 0 of the batch's global step trains from. Returns the balanced shards without
        those keys (what the training ranks still recompute) and the share copied."""
        from rl_train.algorithms.advantage_phase import bypass_old_log_probs, generated_wholly_at

        batch = self.get_batch(batch_id)
        if "step" not in batch:
            raise KeyError(
                f"batch {batch_id!r} has no global step: algorithm.rollout_correction.bypass_current_version "
                "needs the replay buffer to record it (put_batch(..., step=step)), or set it to false"
            )
        keys, partition = batch["keys"], batch["partition"]
        records = self.get(partition, keys)
        rows = generated_wholly_at(records, int(batch["step"]) - 1)
        copied = [keys[i] for i in rows]
        if rows:
            values = bypass_old_log_probs([records[i] for i in rows])
            self.put(partition, {k: {"old_log_probs": v} for k, v in zip(copied, values, strict=True)})
        skip = set(copied)
        shards = [[k for k in shard if k not in skip] for shard in batch["shards"]]
        return shards, {"rollout_corr/old_log_probs_copied": len(rows) / max(len(keys), 1)}

    def compute_advantages(self, batch_id: str) -> dict[str, float]:
        """(6-7) Rollout correction, token rewards (+ in-reward KL) and advantages; returns metrics."""
        batch = self.get_batch(batch_id)
        keys, partition = batch["keys"], batch["partition"]
        records = self.get(partition, keys)
        updates, metrics = self._advantage.compute(records)
        self.put(partition, dict(zip(keys, updates, strict=True)))
        return {**metrics, **agent_metrics(records)}

    def stage_greedy_prompts(self, batch_id: str) -> list[str]:
        """(1, greedy baseline) Copy the batch's prompts into the greedy partition; returns their keys."""
        batch = self.get_batch(batch_id)
        groups = list(batch["groups"])
        prompts = self.get(batch["partition"], groups)
        self.put(
            GREEDY_PARTITION,
            dict(zip(groups, prompts, strict=True)),
            {g: {"kind": "prompt", "status": "pending"} for g in groups},
        )
        return groups

    def set_baseline_rewards(self, batch_id: str, greedy_keys: list[str]) -> dict[str, float]:
        """Write each trajectory's ``baseline_reward`` (its prompt's greedy reward), then delete
        the greedy prompts and answers; returns the greedy answers' mean reward.

        A greedy answer whose grader failed (``is_infra``, R-6.5) gives no baseline: its
        prompt's trajectories are marked ``is_infra`` too (the advantage leaves them out) rather
        than measured against a placeholder 0, and counted in ``greedy_baseline/infra``."""
        greedy = self.get(GREEDY_PARTITION, greedy_keys, ["group_id", "reward"], ["is_infra"])
        no_baseline = {r["group_id"] for r in greedy if r.get("is_infra")}
        baseline = {r["group_id"]: float(r["reward"]) for r in greedy if r["group_id"] not in no_baseline}
        batch = self.get_batch(batch_id)
        keys, partition = batch["keys"], batch["partition"]
        groups = [t["group_id"] for t in self.get_tags(partition, keys)]
        missing = sorted(set(groups) - set(baseline) - no_baseline)
        if missing:
            raise KeyError(f"greedy baseline: no greedy answer was scored for prompt(s) {missing}")
        unknown = {"baseline_reward": 0.0, "is_infra": True, "infra_reason": "its greedy baseline's grader failed"}
        self.put(
            partition,
            {k: unknown if g in no_baseline else {"baseline_reward": baseline[g]} for k, g in zip(keys, groups, strict=True)},
        )
        self.delete(GREEDY_PARTITION, [*baseline, *no_baseline, *greedy_keys])
        metrics = {"greedy_baseline/reward_mean": sum(baseline.values()) / max(len(baseline), 1)}
        if no_baseline:
            metrics["greedy_baseline/infra"] = float(len(no_baseline))
        return metrics
