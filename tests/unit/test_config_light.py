"""Config validation without torch: every name is checked, and every property of a name the
config asks about is read, from the registries' own tables, which import no implementation."""

from __future__ import annotations

from import_probe import imported_after


def test_loading_the_demo_config_imports_no_torch() -> None:
    statement = "from rl_train.config import load_config; load_config('configs/arith-tiny.yaml', [])"
    assert imported_after(statement, ("torch", "prefect", "ray", "transformers")) == []


def test_what_a_config_asks_of_its_names_is_answered_without_torch() -> None:
    """The estimator's inputs, the aggregation's constant length, the policy loss's micro-batch
    statistics and the backend's transport come from the table entries, not from importing them."""
    statement = (
        "from rl_train.algorithms.config import estimator_reads_critic, estimator_reads_greedy_baseline, "
        "norm_length_problem, PER_MICRO_BATCH_LOSSES; "
        "from rl_train.engines.weight_sync.backends import WEIGHT_SYNC_BACKENDS; "
        "assert estimator_reads_critic('gae') and not estimator_reads_critic('grpo'); "
        "assert estimator_reads_greedy_baseline('remax') and not estimator_reads_greedy_baseline('gae'); "
        "assert norm_length_problem('seq-mean-token-sum-norm', None) and not norm_length_problem('token-mean', None); "
        "assert PER_MICRO_BATCH_LOSSES == {'clip_cov', 'kl_cov'}; "
        "assert [n for n in WEIGHT_SYNC_BACKENDS if WEIGHT_SYNC_BACKENDS.get(n).uses_transport] == ['bucketed', 'delta']"
    )
    assert imported_after(statement, ("torch",)) == []
