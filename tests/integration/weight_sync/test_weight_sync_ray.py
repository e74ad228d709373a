"""Weight sync between real Ray actors: a training-side actor sends, two rollout actors receive.

This is the production wiring (R-1.1, R-8): the actors are separate Ray worker processes,
not children of the sender, the descriptor travels through Ray, and every side calls only
``run_sender`` / ``run_receiver``.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.integration


def make_weights() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(256, 200, generator=generator),  # 200 KB > one bucket
        "model.layers.0.mlp.weight": torch.randn(64, 64, generator=generator).to(torch.bfloat16),
        "model.position_ids": torch.arange(97),
        "model.norm.weight": torch.ones(64),
    }


def digest(weights: dict[str, torch.Tensor]) -> dict[str, str]:
    return {
        name: hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
        for name, t in weights.items()
    }


class TrainingSide:
    def __init__(self, fields: dict[str, Any]) -> None:
        from rl_train.engines.weight_sync import WeightSyncConfig, build_weight_sync_backend

        self.sender = build_weight_sync_backend(WeightSyncConfig(**fields)).build_sender()
        self.weights = make_weights()

    def descriptor(self) -> dict[str, Any]:
        return self.sender.descriptor()

    def train_step(self, seed: int) -> dict[str, str]:
        """Change about 1% of the float entries, as an optimizer step would."""
        generator = torch.Generator().manual_seed(seed)
        for tensor in self.weights.values():
            if tensor.is_floating_point():
                mask = torch.rand(tensor.shape, generator=generator) < 0.01
                tensor[mask] += 1.0
        return digest(self.weights)

    def sync(self, version: int) -> dict[str, float]:
        from rl_train.engines.weight_sync.boundaries import run_sender

        return run_sender(self.sender, lambda: iter(self.weights.items()), version)[1]

    def close(self) -> None:
        self.sender.close()  # the creator unlinks the shared memory; a killed actor would leak it


class RolloutSide:
    """A rollout replica whose engine copies received tensors into its own weights."""

    def __init__(self, fields: dict[str, Any], descriptor: dict[str, Any]) -> None:
        from rl_train.engines.weight_sync import WeightSyncConfig, build_weight_sync_backend

        self.receiver = build_weight_sync_backend(WeightSyncConfig(**fields)).build_receiver(descriptor)
        self.weights = {name: torch.zeros_like(t) for name, t in make_weights().items()}
        self.version = -1

    def abort(self) -> int:
        return 0

    def release_kv_cache(self) -> None: ...

    def update_weights(self, named_tensors: Any, version: int) -> None:
        for name, tensor in named_tensors:
            self.weights[name].copy_(tensor)
        self.version = version

    def reset_prefix_cache(self) -> None: ...

    def resume_kv_cache(self) -> None: ...

    def sync(self, version: int) -> tuple[int, dict[str, str]]:
        from rl_train.engines.weight_sync.boundaries import run_receiver

        run_receiver(self, self.receiver, None, version, 30.0)
        return self.version, digest(self.weights)

    def close(self) -> None:
        self.receiver.close()


@pytest.mark.parametrize("backend", ["bucketed", "delta"])
def test_training_actor_syncs_two_rollout_actors_over_shm(ray_local, backend: str) -> None:
    ray = ray_local
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests
    fields = {
        "backend": backend,
        "transport": "shm",
        "num_receivers": 2,
        "bucket_size_bytes": 64 << 10,
        "timeout_seconds": 30.0,
    }
    trainer = ray.remote(num_cpus=0)(TrainingSide).remote(fields)
    descriptor = ray.get(trainer.descriptor.remote())
    rollouts = [ray.remote(num_cpus=0)(RolloutSide).remote(fields, descriptor) for _ in range(2)]
    expected = digest(make_weights())
    for version in range(3):
        if version:
            expected = ray.get(trainer.train_step.remote(seed=version))
        received = [rollout.sync.remote(version) for rollout in rollouts]
        metrics = ray.get(trainer.sync.remote(version))
        for served_version, weights_digest in ray.get(received):
            assert served_version == version
            assert weights_digest == expected
        if backend == "delta" and version:
            assert metrics["weight_sync/bytes"] < metrics["weight_sync/export_bytes"] / 5
    ray.get([actor.close.remote() for actor in (trainer, *rollouts)])
    for actor in (trainer, *rollouts):
        ray.kill(actor)
