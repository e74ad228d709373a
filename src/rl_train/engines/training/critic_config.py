"""``critic.*``: the value model's switch, optimizer and batching, plus the value-loss fields.

The critic is a second model (the policy's architecture with a scalar value head, started
from the policy's weights) in its own pool of Ray actors. It exists for the estimators that
read values (``gae``): ``enable`` left unset follows the estimator, and a config whose
estimator and switch disagree is refused at load (``check_critic_enable``).

The lr default is the demo policy's, 1e-3, with one pass over each batch. Fitting the tiny
critic alone to returns that say whether a sampled sum is right, 3e-3 explains variance
sooner (0.1 after 30 batches of 1,024 samples, where 1e-3 and 1e-2 stayed at 0.0), and a
second pass (``ppo_epochs`` 2) sooner still (0.16). But over whole PPO runs on the demo the
faster critic trained the policy worse: 3e-3 with 2 passes reached a 5-step mean reward of
0.41 by step 300, 1e-3 with one pass 0.75 (and 0.83 at best by step 410), since a critic that
chases each batch gives the policy noisier advantages. What stalled those runs was the
policy's entropy, not the critic: with ``actor.entropy_coeff=0.01`` the same critic takes
PPO + GAE to 0.9 at step 191 (``bench/RESULTS.md``, convergence). The warm-up keeps Adam's first,
full-size steps from throwing the fresh head's values far off.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from rl_train.algorithms.config import ValueLossConfig, estimator_reads_critic, norm_length_problem


class CriticConfig(ValueLossConfig):
    enable: bool | None = None
    """Train a value model (values and critic_update phases); None: on exactly when algorithm.adv_estimator reads values (gae)."""
    lr: float = Field(1e-3, gt=0)
    """Peak learning rate of the critic's AdamW."""
    lr_warmup_steps: int = Field(5, ge=0)
    """Linear warm-up of the critic's lr, in critic optimizer steps; constant afterwards."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay of the critic."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas of the critic."""
    grad_clip: float = Field(1.0, gt=0)
    """Clip the critic's global grad norm to this value."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Samples per critic training micro-batch (None: no count limit)."""
    max_tokens_per_micro_batch: int | None = Field(None, ge=1)
    """Padded-token budget per critic training micro-batch (None: no budget)."""
    infer_micro_batch_size: int | None = Field(None, ge=1)
    """Samples per forward-only micro-batch of the values phase."""
    ppo_epochs: int | None = Field(None, ge=1)
    """Passes of the critic over each batch per critic update (None: actor.ppo_epochs)."""
    ppo_mini_batch_size: int | None = Field(None, ge=1)
    """Prompt groups per critic optimizer step within an update (None: actor.ppo_mini_batch_size)."""
    num_ranks: int = Field(1, ge=1)
    """Data-parallel critic ranks (Ray actors of the critic pool, joined by torch.distributed)."""
    num_threads: int = Field(2, ge=1)
    """torch intra-op threads per critic rank."""

    @model_validator(mode="after")
    def _norm_length_given(self) -> CriticConfig:
        error = norm_length_problem(self.loss_agg_mode, self.loss_agg_norm_length)
        if error:
            raise ValueError(error)
        return self


def check_critic_enable(critic: CriticConfig, adv_estimator: str) -> bool:
    """Whether the run has a critic: ``critic.enable``, or, when unset, what the estimator needs.

    Raises ``ValueError`` (naming the dotted paths) when the switch contradicts the estimator:
    an estimator that reads values cannot run without a critic, and a critic that nothing
    reads would only cost a second model's compute.
    """
    needed = estimator_reads_critic(adv_estimator)
    if critic.enable is None or critic.enable == needed:
        return needed
    if needed:
        raise ValueError(
            f"critic.enable is false but algorithm.adv_estimator {adv_estimator!r} reads critic values; "
            "remove critic.enable (it follows the estimator) or pick an estimator without a critic"
        )
    raise ValueError(
        f"critic.enable is true but algorithm.adv_estimator {adv_estimator!r} reads no critic values, "
        "so the critic would train for nothing; use an estimator that reads values (gae) or remove critic.enable"
    )
