"""The built-in rollout engine: batched sampling on torch with a KV cache.

Requests are left-padded into one batch; positions come from the attention mask so that a
padded row computes exactly what it would alone, and what the training engine computes on
the right-padded sequence. ``abort`` may be called from another thread (a Ray actor with
concurrency > 1): the decode loop stops at the next token and every request returns what it
has with stop_reason "aborted".
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from rl_train.engines.model.tiny import load_policy
from rl_train.engines.rollout.protocol import GenerationRequest, GenerationResult, SamplingParams
from rl_train.engines.rollout.sampling import sample_tokens
from rl_train.engines.weight_sync.base import NamedTensors
from rl_train.engines.weight_sync.boundaries import SparseUpdates, write_entries


class EngineStateError(RuntimeError):
    """The engine was asked to generate while asleep or with its KV cache released."""


class TorchRolloutEngine:
    def __init__(self, model_path: str | Path, seed: int = 0, max_batch_size: int = 1024) -> None:
        self.model, self.tokenizer = load_policy(model_path)
        self.model.eval()
        self.eos_token_id = int(self.tokenizer.eos_token_id)
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        self.max_batch_size = max_batch_size
        self.version = 0
        self._generator = torch.Generator().manual_seed(seed)
        self._abort = threading.Event()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._offloaded: dict[str, torch.Tensor] | None = None
        self._kv_released = False

    # -- generation ---------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        if self._offloaded is not None:
            raise EngineStateError("rollout engine is asleep; call wake_up() before generate()")
        if self._kv_released:
            raise EngineStateError("rollout engine's KV cache is released; call resume_kv_cache() first")
        self._abort.clear()
        results: list[GenerationResult] = []
        for start in range(0, len(requests), self.max_batch_size):
            results.extend(self._generate_batch(requests[start : start + self.max_batch_size], params))
        return results

    @torch.no_grad()
    def _generate_batch(
        self, requests: list[GenerationRequest], params: SamplingParams
    ) -> list[GenerationResult]:
        contexts = [r.prompt_ids + r.response_prefix for r in requests]
        batch_size, width = len(contexts), max(len(c) for c in contexts)
        input_ids = torch.full((batch_size, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((batch_size, width), dtype=torch.long)
        for i, ids in enumerate(contexts):
            input_ids[i, width - len(ids) :] = torch.tensor(ids)
            attention[i, width - len(ids) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        budget = [max(params.max_new_tokens - len(r.response_prefix), 0) for r in requests]
        new_ids: list[list[int]] = [[] for _ in requests]
        new_logps: list[list[float]] = [[] for _ in requests]
        stop: list[str | None] = [None if b > 0 else "length" for b in budget]
        cache = DynamicCache()
        self._in_flight += batch_size
        try:
            step_ids, step_pos = input_ids, positions
            for step in range(max(budget, default=0)):
                if self._abort.is_set():
                    stop = [s or "aborted" for s in stop]
                    break
                out = self.model(
                    input_ids=step_ids,
                    attention_mask=attention,
                    position_ids=step_pos,
                    cache=cache,
                    use_cache=True,
                )
                tokens, logps = sample_tokens(
                    out.logits[:, -1], params.temperature, params.top_p, self._generator
                )
                for i in range(batch_size):
                    if stop[i] is None:
                        new_ids[i].append(int(tokens[i]))
                        new_logps[i].append(float(logps[i]))
                        if int(tokens[i]) == self.eos_token_id:
                            stop[i] = "eos"
                        elif step + 1 >= budget[i]:
                            stop[i] = "length"
                if all(s is not None for s in stop):
                    break
                step_ids = tokens[:, None]
                step_pos = step_pos[:, -1:] + 1
                attention = torch.cat([attention, torch.ones((batch_size, 1), dtype=torch.long)], dim=1)
        finally:
            self._in_flight -= batch_size
        return [
            GenerationResult(
                request_id=r.request_id,
                prompt_ids=list(r.prompt_ids),
                response_ids=list(r.response_prefix) + new_ids[i],
                log_probs=new_logps[i],
                token_versions=[self.version] * len(new_ids[i]),
                stop_reason=stop[i] or "aborted",  # type: ignore[arg-type]
            )
            for i, r in enumerate(requests)
        ]

    # -- lifecycle (R-5.3) --------------------------------------------------------------
    def abort(self) -> int:
        """Stop in-flight generation; returns how many requests were in flight."""
        self._abort.set()
        return self._in_flight

    def sleep(self) -> None:
        """Free the model's memory (weights move to a host-side copy) until ``wake_up``."""
        with self._lock:
            if self._offloaded is not None:
                return
            # On a GPU this is where device memory is given back; tied weights share one
            # Parameter, so named_parameters() (which de-duplicates) visits each storage once.
            self._offloaded = {}
            for name, param in self.model.named_parameters():
                self._offloaded[name] = param.data
                param.data = torch.empty(0, dtype=param.dtype)

    def wake_up(self) -> None:
        with self._lock:
            if self._offloaded is None:
                return
            state, self._offloaded = self._offloaded, None
            for name, param in self.model.named_parameters():
                param.data = state[name]

    def release_kv_cache(self) -> None:
        """Keep weights, drop cache memory (the built-in engine keeps no cache between calls)."""
        self._kv_released = True

    def resume_kv_cache(self) -> None:
        self._kv_released = False

    def reset_prefix_cache(self) -> None:
        """No prefix cache survives a request here, so nothing from an old version can leak."""
        return None

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Load HF-named tensors in place and start serving ``version``."""
        with torch.no_grad():
            for dest, tensor in self._storages("update_weights", named_tensors):
                dest.copy_(tensor)
        self.version = version

    def update_weights_sparse(self, updates: SparseUpdates, version: int) -> None:
        """Overwrite the given flat positions of HF-named tensors in place; serve ``version``."""
        with torch.no_grad():
            for dest, index, values in self._storages("update_weights_sparse", updates):
                write_entries(dest, index, values)
        self.version = version

    def _storages(self, caller: str, items: Iterable[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
        """(storage, *rest) for every (HF name, *rest) item.

        While asleep, a tied alias (lm_head.weight) has no storage of its own and is skipped.
        """
        offloaded = self._offloaded
        # keep_vars: tied weights appear under every name they are known by
        storages = offloaded if offloaded is not None else self.model.state_dict(keep_vars=True)
        for name, *rest in items:
            dest = storages.get(name)
            if dest is not None:
                yield dest, *rest
            elif offloaded is None:
                raise KeyError(f"{caller}: the rollout model has no tensor named {name!r}")
