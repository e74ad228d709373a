"""A rollout replica: turns prompt records into trajectory records (R-5.1, R-5.2)."""

from __future__ import annotations

from typing import Any

import ray
import torch

from rl_train.engines.rollout.protocol import GenerationRequest, SamplingParams
from rl_train.engines.rollout.torch_engine import TorchRolloutEngine
from rl_train.engines.weight_sync.base import WeightReceiver
from rl_train.engines.weight_sync.boundaries import run_receiver


class RolloutWorker:
    def __init__(self, model_path: str, tq: Any, seed: int, num_threads: int) -> None:
        torch.set_num_threads(num_threads)
        torch.set_flush_denormal(True)  # denormal floats in a tiny model slow CPU kernels 10x
        self.engine = TorchRolloutEngine(model_path, seed=seed)
        self.tokenizer = self.engine.tokenizer
        self.tq = tq
        self.receiver: WeightReceiver | None = None

    def encode_prompt(self, text: str) -> list[int]:
        return [self.tokenizer.bos_token_id, *self.tokenizer.encode(text, add_special_tokens=False)]

    def generate_prompts(
        self, partition: str, prompt_keys: list[str], n: int, params: dict[str, Any]
    ) -> list[str]:
        """Sample ``n`` trajectories per prompt; returns the trajectory keys written."""
        prompts = ray.get(self.tq.get.remote(partition, prompt_keys))
        ray.get(self.tq.set_tags.remote(partition, {k: {"status": "running"} for k in prompt_keys}))
        try:
            requests = []
            for key, prompt in zip(prompt_keys, prompts, strict=True):
                ids = self.encode_prompt(prompt["prompt"])
                requests.extend(GenerationRequest(f"{key}/{j}", ids) for j in range(n))
            results = self.engine.generate(requests, SamplingParams(**params))
        except Exception:
            ray.get(self.tq.set_tags.remote(partition, {k: {"status": "failure"} for k in prompt_keys}))
            raise
        records, tags = {}, {}
        for i, result in enumerate(results):
            key, prompt = prompt_keys[i // n], prompts[i // n]
            records[result.request_id] = {
                "prompt_ids": result.prompt_ids,
                "response_ids": result.response_ids,
                "rollout_log_probs": result.log_probs,
                "token_versions": result.token_versions,
                "group_id": key,
                "data_source": prompt["data_source"],
                "ground_truth": prompt["ground_truth"],
            }
            tags[result.request_id] = {
                "kind": "trajectory",
                "status": result.stop_reason,
                "group_id": key,
                "prompt_len": len(result.prompt_ids),
                "response_len": len(result.response_ids),
                "version": min(result.token_versions, default=self.engine.version),
            }
        ray.get(self.tq.put.remote(partition, records, tags))
        ray.get(self.tq.set_tags.remote(partition, {k: {"status": "finished"} for k in prompt_keys}))
        return list(records)

    # -- lifecycle and weights ----------------------------------------------------------
    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def abort(self) -> int:
        return self.engine.abort()

    def version(self) -> int:
        return self.engine.version

    def open_receiver(self, backend: Any, descriptor: dict[str, Any]) -> None:
        self.receiver = backend.build_receiver(descriptor)

    def receive_weights(self, payload: Any, version: int, timeout_seconds: float) -> dict[str, float]:
        assert self.receiver is not None, "open_receiver() first"
        return run_receiver(self.engine, self.receiver, payload, version, timeout_seconds)
