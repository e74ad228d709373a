"""``actor.*``: the training engine's optimisation knobs plus the policy-loss fields."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rl_train.algorithms.config import PER_MICRO_BATCH_LOSSES, PolicyLossConfig, StrictModel
from rl_train.engines.training.lora_config import LoraSettings
from rl_train.engines.training.registry import TrainingEngineName
from rl_train.engines.training.router_replay_modes import RouterReplayName


class MegatronParallelConfig(StrictModel):
    """``actor.megatron.*``: how the megatron engine lays its ranks out (data parallel is what
    is left of ``actor.num_ranks``)."""

    tensor_parallel_size: int = Field(1, ge=1)
    """Ranks that split each layer's weights (megatron-core tensor parallelism)."""
    pipeline_parallel_size: int = Field(1, ge=1)
    """Ranks that split the layers into stages (megatron-core pipeline parallelism)."""


class ActorConfig(PolicyLossConfig):
    engine: TrainingEngineName = "torch"
    """Registered training engine (rl_train.engines.training.registry.TRAINING_ENGINES)."""
    lr: float = Field(1e-3, gt=0)
    """Peak learning rate of AdamW."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    """LR decay after warm-up; its horizon is trainer.total_steps x trainer.parameter_sync_step (R-2.3)."""
    lr_warmup_steps: int = Field(0, ge=0)
    """Linear warm-up, in optimizer steps."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Floor of the decayed LR as a fraction of the peak."""
    lr_decay_ratio: float = Field(1.0, gt=0, le=1)
    """The decay ends at this fraction of the schedule's horizon; the LR then stays at min_lr_ratio x lr."""
    grad_clip: float = Field(1.0, gt=0)
    """Clip the global grad norm to this value."""
    max_nonfinite_steps_in_row: int = Field(3, ge=1)
    """Stop the run after this many optimizer steps in a row skipped for a NaN/inf grad norm (each is counted in actor/nonfinite_steps)."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Samples per training micro-batch (None: no count limit)."""
    max_tokens_per_micro_batch: int | None = Field(None, ge=1)
    """Padded-token budget per training micro-batch (dynamic batching; None: no budget)."""
    infer_micro_batch_size: int | None = Field(None, ge=1)
    """Samples per forward-only micro-batch (old_log_prob, ref)."""
    sort_by_length: bool = False
    """torch engine: put rows of like length in the same micro-batch (every pass, the update included; results come back in the batch's order), cutting where the padding saved outweighs a micro-batch's fixed cost. Pays when lengths differ, as multi-turn trajectories' do; the sums the update makes are the same up to float rounding (refused with clip_cov and kl_cov, whose statistics are per micro-batch)."""
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each batch per update."""
    ppo_mini_batch_size: int | None = Field(None, ge=1)
    """Prompt groups per optimizer step within an update (None: the whole batch, one step)."""
    num_ranks: int = Field(1, ge=1)
    """Training ranks (Ray actors joined by torch.distributed): data-parallel ones, times actor.megatron's tensor x pipeline split."""
    num_threads: int = Field(2, ge=1)
    """torch intra-op threads per rank."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of the training engine."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the torch engine's ranks keep the policy: cuda gives each rank a GPU (shared with a rollout replica in the colocated modes) and NCCL between ranks; megatron uses CUDA whenever it is visible."""
    router_replay: RouterReplayName = "off"
    """MoE router replay (megatron engine, R-4.8): r2 records each token's experts in the old_log_prob pass and routes the update by them; r3 routes old_log_prob and the update by the experts rollout used (built-in rollout engine)."""
    fsdp: bool = False
    """torch engine: shard weights, gradients and Adam's moments over the data-parallel ranks (FSDP2, torch's fully_shard); every weight export then gathers the whole model from all ranks."""
    megatron: MegatronParallelConfig = MegatronParallelConfig()
    """Tensor and pipeline parallel sizes of the megatron engine (``engine: megatron``)."""
    lora: LoraSettings | None = None
    """torch engine: train low-rank adapters through PEFT (the lora extra) instead of every weight (None: full fine-tuning). The reference is the base with the adapters off; checkpoints hold the adapters, their optimizer state and the base model's checksum; weight sync sends the adapters alone or the merged weights (actor.lora.sync). With actor.fsdp the frozen base weights and the adapters are sharded alike, the adapters' gradients and Adam's moments too, and each rank's checkpoint holds its own shards."""

    @model_validator(mode="after")
    def _parallel_layout_fits(self) -> ActorConfig:
        model_parallel = self.megatron.tensor_parallel_size * self.megatron.pipeline_parallel_size
        if model_parallel > 1 and self.engine != "megatron":
            raise ValueError(
                f"actor.megatron sets tensor x pipeline parallel {model_parallel} but actor.engine is "
                f"{self.engine!r}; only engine megatron splits a model"
            )
        if self.lora is not None and self.router_replay != "off":
            raise ValueError(
                f"actor.lora with actor.router_replay {self.router_replay!r}: routes are replayed on megatron-core's "
                "MoE routers, and LoRA trains on the torch engine; set actor.router_replay: off or remove actor.lora"
            )
        if self.router_replay != "off" and self.engine != "megatron":
            raise ValueError(
                f"actor.router_replay {self.router_replay!r} replays megatron-core's MoE routers; "
                f"actor.engine is {self.engine!r} (set it to 'megatron')"
            )
        if self.fsdp and self.engine != "torch":
            raise ValueError(
                f"actor.fsdp shards the torch engine; actor.engine {self.engine!r} shards its own way "
                "(megatron: its distributed optimizer)"
            )
        if self.lora is not None and self.engine != "torch":
            raise ValueError(
                f"actor.lora trains PEFT adapters on the torch engine; actor.engine {self.engine!r} has no "
                "LoRA here (megatron-core's own is not wired in): set actor.engine: torch or remove actor.lora"
            )
        if self.sort_by_length and self.engine != "torch":
            raise ValueError(
                f"actor.sort_by_length reorders the torch engine's micro-batches; actor.engine is "
                f"{self.engine!r}, which cuts its own (set actor.sort_by_length: false)"
            )
        if self.sort_by_length and self.policy_loss in PER_MICRO_BATCH_LOSSES:
            raise ValueError(
                f"actor.sort_by_length changes which rows share a micro-batch, and actor.policy_loss "
                f"{self.policy_loss!r} takes its statistics per micro-batch: it would train differently "
                "(set actor.sort_by_length: false)"
            )
        if self.num_ranks % model_parallel:
            raise ValueError(
                f"actor.num_ranks={self.num_ranks} is not divisible by actor.megatron.tensor_parallel_size x "
                f"pipeline_parallel_size = {model_parallel}"
            )
        return self

    @model_validator(mode="after")
    def _kl_needs_coef(self) -> ActorConfig:
        if self.kl_loss and self.kl_loss_coef <= 0:
            raise ValueError("actor.kl_loss is on but actor.kl_loss_coef is 0; set a positive coefficient")
        return self
