"""``actor.*``: the training engine's optimisation knobs plus the policy-loss fields."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rl_train.algorithms.config import PolicyLossConfig
from rl_train.engines.training.registry import TrainingEngineName


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
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each batch per update."""
    ppo_mini_batch_size: int | None = Field(None, ge=1)
    """Prompt groups per optimizer step within an update (None: the whole batch, one step)."""
    num_ranks: int = Field(1, ge=1)
    """Data-parallel training ranks (Ray actors joined by torch.distributed)."""
    num_threads: int = Field(2, ge=1)
    """torch intra-op threads per rank."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of the training engine."""

    @model_validator(mode="after")
    def _kl_needs_coef(self) -> ActorConfig:
        if self.kl_loss and self.kl_loss_coef <= 0:
            raise ValueError("actor.kl_loss is on but actor.kl_loss_coef is 0; set a positive coefficient")
        return self
