"""Which settings a resumed run may change (``flows/resume.config_differences``)."""

from __future__ import annotations

from rl_train.config import load_config
from rl_train.flows.resume import config_differences


def test_throughput_and_where_settings_may_differ_but_what_it_trains_may_not() -> None:
    saved = load_config("configs/arith-tiny.yaml", []).model_dump(mode="json")
    allowed = load_config(
        "configs/arith-tiny.yaml",
        ["trainer.total_steps=200", "actor.infer_micro_batch_size=32", "trainer.step_layout=nested"],
    )
    assert config_differences(saved, allowed) == []
    changed = load_config("configs/arith-tiny.yaml", ["actor.lr=0.01", "actor.micro_batch_size=8"])
    assert config_differences(saved, changed) == [
        "actor.lr: 0.001 -> 0.01",
        "actor.micro_batch_size: None -> 8",
    ]
