"""separate_async's staleness bound (R-2.6) is reached and never exceeded, under drop and under wait.

Six global steps with ``parameter_sync_step`` 4, so the bound is 4 versions behind (R-7.2
staleness 5, the mode's default threshold). The warm-up queue is deeper than the bound: 48
groups (``prefetch_batches`` 23 at 2 groups per local update, six global batches), all
generated under version 0 before step 1 starts. Groups are sampled oldest first, so step k
trains version-0 groups k - 1 versions behind: step 5 meets the bound, and the eight
version-0 groups left for step 6 would be 5 behind. Both strategies must evict them: ``wait``
holds sampling for prompts still in flight, but no wait makes a finished group fresher.

The push is never awaited within its step, so the rollout pool serves version step - 1 or
step - 2 while a step samples: the refills of step k are tagged k - 1 yet may carry
version k - 2 tokens. Staleness is measured from the tokens' own versions, so the bound
holds either way; only the served version that a step reports may lag by one.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from rl_train.config import Config, apply_mode_defaults
from rl_train.flows.separate_async import SeparateAsyncTrainer

pytestmark = pytest.mark.integration

PARAMETER_SYNC_STEP = 4
GROUPS_PER_UPDATE = 2  # train_batch_size 8 / parameter_sync_step 4
WARM_UP_GROUPS = 48  # GROUPS_PER_UPDATE x (1 + prefetch_batches 23): six global batches


class WarmedUpTrainer(SeparateAsyncTrainer):
    """Starts step 1 only once the whole warm-up queue is generated, all of it under version 0."""

    def on_train_begin(self) -> None:
        super().on_train_begin()
        deadline = time.monotonic() + 120
        tq = self.pools.queue.records
        while len(tq.query("train", kind="prompt", status="finished")) < WARM_UP_GROUPS:
            assert time.monotonic() < deadline, "the warm-up queue was not generated in time"
            time.sleep(0.1)


def _config(small_run_config: dict[str, Any], strategy: str) -> Config:
    cfg = copy.deepcopy(small_run_config)
    cfg["trainer"].update(
        mode="separate_async",
        total_steps=6,
        train_batch_size=PARAMETER_SYNC_STEP * GROUPS_PER_UPDATE,
        parameter_sync_step=PARAMETER_SYNC_STEP,
        use_prefect=False,
        val_every_steps=0,
    )
    cfg["rollout"].update(n=2, max_new_tokens=4)
    cfg["rollout"]["weight_sync"] = {"backend": "bucketed", "transport": "shm", "bucket_size_bytes": 1 << 16}
    cfg["replay"] = {
        "staleness_strategy": strategy,
        "prefetch_batches": WARM_UP_GROUPS // GROUPS_PER_UPDATE - 1,
    }
    apply_mode_defaults(cfg)
    return Config.model_validate(cfg)


@pytest.mark.parametrize("strategy", ["drop", "wait"])
def test_staleness_reaches_parameter_sync_step_and_never_exceeds_it(
    small_run_config: dict[str, Any], ray_local, strategy: str
) -> None:
    config = _config(small_run_config, strategy)
    assert config.replay.max_off_policy_threshold == PARAMETER_SYNC_STEP + 1  # the mode's default
    history = WarmedUpTrainer(config).fit()
    assert [m["step"] for m in history] == [1, 2, 3, 4, 5, 6]
    staleness = [m["replay/staleness_max"] for m in history]
    assert max(staleness) == PARAMETER_SYNC_STEP, staleness  # the bound is reached ...
    assert staleness[4] == PARAMETER_SYNC_STEP  # ... by step 5's version-0 groups
    for m in history:
        behind = [int(k.rsplit("/", 1)[1]) for k, v in m.items() if "staleness_hist/" in k and v]
        assert max(behind) <= PARAMETER_SYNC_STEP, m  # ... and no sample of any step exceeds it
        assert m["rollout/version/0"] in (m["step"] - 1, m["step"])  # the push is not awaited
        assert "actor/loss" in m
    # pi_old of step k is version k - 1 (R-2.8), so step 1's groups, all sampled by version 0,
    # take their rollout log-probs as old_log_probs (the mode's bypass_current_version default),
    # and the version-0 groups of steps 2-5 are all recomputed.
    assert config.algorithm.rollout_correction.bypass_current_version
    assert [m["rollout_corr/old_log_probs_copied"] for m in history[:5]] == [1.0, 0.0, 0.0, 0.0, 0.0]
    # The version-0 groups left for step 6 (at least the eight beyond five global batches) are
    # evicted, not trained, and each costs one refill.
    assert history[5]["replay/evicted_staleness"] >= WARM_UP_GROUPS - 5 * 2 * PARAMETER_SYNC_STEP
    assert sum(m["replay/evicted_staleness"] for m in history[:5]) == 0
    assert history[5]["replay/refill"] == history[5]["replay/evicted_staleness"]
