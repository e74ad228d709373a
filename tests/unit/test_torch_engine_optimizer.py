"""The torch engine's AdamW runs fused (one kernel per parameter) and steps as foreach does."""

from __future__ import annotations

from pathlib import Path

import torch

from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.torch_engine import TorchTrainingEngine


def test_the_engine_steps_with_a_fused_adamw_that_matches_foreach(tiny_model_dir: Path) -> None:
    engine = TorchTrainingEngine(tiny_model_dir, ActorConfig(lr=1e-3, weight_decay=0.01, grad_clip=1e9), 100)
    assert engine.optimizer.param_groups[0]["fused"] is True
    params = list(engine.model.parameters())
    shadow = [p.detach().clone().requires_grad_(True) for p in params]
    reference = torch.optim.AdamW(shadow, lr=1e-3, betas=engine.cfg.betas, weight_decay=0.01, foreach=True)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        for p, s in zip(params, shadow, strict=True):
            p.grad = torch.randn(p.shape, generator=generator) * 1e-2
            s.grad = p.grad.clone()
        engine.optimizer_step()
        reference.step()
        for group in reference.param_groups:  # the engine's schedule (warm-up) sets its lr each step
            group["lr"] = engine.optimizer.param_groups[0]["lr"]
    worst = max(float((p.detach() - s.detach()).abs().max()) for p, s in zip(params, shadow, strict=True))
    moved = max(float((p.detach() - q).abs().max()) for p, q in zip(params, _initial(tiny_model_dir), strict=True))
    assert moved > 0  # the steps did train
    assert worst < 1e-5
    before = engine.optimizer.state_dict()
    engine.load_state_dict(engine.state_dict())  # a resume keeps the fused optimizer
    assert engine.optimizer.param_groups[0]["fused"] is True
    assert before["state"].keys() == engine.optimizer.state_dict()["state"].keys()


def _initial(model_dir: Path) -> list[torch.Tensor]:
    from rl_train.engines.model.loading import load_policy

    model, _ = load_policy(model_dir)
    return [p.detach() for p in model.parameters()]
