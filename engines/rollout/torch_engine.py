"""The built-in rollout engine: batched sampling on torch with a KV cache, on CPU or one GPU.

Requests are left-padded into one batch; positions come from the attention mask so that a
padded row computes exactly what it would alone, and what the training engine computes on
the right-padded sequence. ``abort`` may be called from another thread (a Ray actor with
concurrency > 1): the decode loop stops at the next token and every request returns what it
has with stop_reason "aborted".

Memory. The KV cache of a batch lives only while the batch decodes: it is built for the
batch and dropped when the batch returns, so an idle engine holds no KV memory at all.
``sleep`` and ``release_kv_cache`` therefore free the cache by aborting in-flight batches and
waiting until none is left (a cache is never offloaded: it would be stale after the next
weight sync anyway). ``sleep`` then moves the weights (parameters and buffers) to host
memory, pinned so that ``wake_up`` copies them back at full bandwidth, and returns the
allocator's cached device blocks. On a CPU engine the weights already live in host memory:
an offload would only copy them within the same memory (doubling the peak to free nothing),
so they stay where they are and the engine merely refuses to generate until ``wake_up``.
Weights pushed while asleep are written into wherever the weights are.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from rl_train.engines.model.loading import load_policy, new_kv_cache
from rl_train.engines.rollout.protocol import (
    EngineStateError,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    check_can_generate,
)
from rl_train.engines.rollout.sampling import sample_tokens
from rl_train.engines.weight_sync.base import NamedTensors
from rl_train.engines.weight_sync.boundaries import SparseUpdates, write_entries

__all__ = ["EngineStateError", "TorchRolloutEngine"]

HOST = torch.device("cpu")


class TorchRolloutEngine:
    def __init__(
        self,
        model_path: str | Path,
        seed: int = 0,
        max_batch_size: int = 1024,
        device: str = "cpu",
        model_impl: str = "auto",
    ) -> None:
        self.device = torch.device(device)
        model, self.tokenizer = load_policy(model_path, impl=model_impl)
        self.model = model.to(self.device).eval()
        self.eos_token_id = int(self.tokenizer.eos_token_id)
        experts = int(getattr(self.model.config, "num_local_experts", 0) or 0)
        self.moe_top_k = int(self.model.config.num_experts_per_tok) if experts else 0
        """Experts per token of an MoE policy (0: a dense one, which has no routes to return)."""
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        self.max_batch_size = max_batch_size
        self.version = 0
        self._generator = torch.Generator(self.device).manual_seed(seed)
        self._abort = threading.Event()
        self._state = threading.Condition()
        self._in_flight = 0
        self._asleep = False
        self._kv_released = False

    def sampling_state(self) -> torch.Tensor:
        return self._generator.get_state()

    def load_sampling_state(self, state: torch.Tensor) -> None:
        self._generator.set_state(state)

    # -- generation ---------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        with self._state:
            check_can_generate(self._asleep, self._kv_released)
            self._abort.clear()
            self._in_flight += len(requests)
        generator = self._generator
        if params.seed is not None:
            generator = torch.Generator(self.device).manual_seed(params.seed)
        try:
            results: list[GenerationResult] = []
            for start in range(0, len(requests), self.max_batch_size):
                batch = requests[start : start + self.max_batch_size]
                results.extend(self._generate_batch(batch, params, generator))
            return results
        finally:
            with self._state:
                self._in_flight -= len(requests)
                self._state.notify_all()

    @torch.no_grad()
    def _generate_batch(
        self, requests: list[GenerationRequest], params: SamplingParams, generator: torch.Generator
    ) -> list[GenerationResult]:
        """Decode one left-padded batch; its KV cache is a local and dies with this call."""
        contexts = [r.prompt_ids + r.response_prefix for r in requests]
        batch_size, width = len(contexts), max(len(c) for c in contexts)
        input_ids = torch.full((batch_size, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((batch_size, width), dtype=torch.long)
        for i, ids in enumerate(contexts):
            input_ids[i, width - len(ids) :] = torch.tensor(ids)
            attention[i, width - len(ids) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        budget = [max(params.max_new_tokens - len(r.response_prefix), 0) for r in requests]
        new_ids: list[list[int]] = [[] for _ in requests]
        new_logps: list[list[float]] = [[] for _ in requests]
        stop: list[str | None] = [None if b > 0 else "length" for b in budget]
        with_routes = params.return_routes and self.moe_top_k > 0
        routes: list[list[list[list[int]]]] = [[] for _ in requests]  # per row: per fed token, [L][k]
        chosen: list[torch.Tensor] = []  # each MoE layer's experts for the tokens of the last forward
        hooks = self._route_hooks(chosen) if with_routes else []
        try:
            self._decode(
                requests, params, generator, input_ids, attention, positions, contexts, budget, new_ids, new_logps,
                stop, routes, chosen, with_routes,
            )  # fmt: skip
        finally:
            for hook in hooks:
                hook.remove()
        return self._results(requests, contexts, new_ids, new_logps, stop, routes, with_routes)

    def _decode(
        self,
        requests: list[GenerationRequest],
        params: SamplingParams,
        generator: torch.Generator,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        positions: torch.Tensor,
        contexts: list[list[int]],
        budget: list[int],
        new_ids: list[list[int]],
        new_logps: list[list[float]],
        stop: list[str | None],
        routes: list[list[list[list[int]]]],
        chosen: list[torch.Tensor],
        with_routes: bool,
    ) -> None:
        """The decode loop: sample into ``new_ids`` / ``new_logps`` until every row stops."""
        batch_size = len(requests)
        eos = None if params.ignore_eos else self.eos_token_id
        cache = new_kv_cache(self.model)
        step_ids, step_pos = input_ids, positions
        for step in range(max(budget, default=0)):
            if self._abort.is_set():
                stop[:] = [s or "aborted" for s in stop]
                break
            logits = self.model(
                input_ids=step_ids,
                attention_mask=attention,
                position_ids=step_pos,
                cache=cache,
                use_cache=True,
            ).logits[:, -1]
            if with_routes:
                self._keep_routes(chosen, step_ids.shape, routes, contexts if step == 0 else None)
            tokens, logps = sample_tokens(logits, params.temperature, params.top_p, generator)
            token_list, logp_list = tokens.tolist(), logps.tolist()
            for i in range(batch_size):
                if stop[i] is None:
                    new_ids[i].append(token_list[i])
                    new_logps[i].append(logp_list[i])
                    if token_list[i] == eos:
                        stop[i] = "eos"
                    elif step + 1 >= budget[i]:
                        stop[i] = "length"
            if all(s is not None for s in stop):
                break
            step_ids = tokens[:, None]
            step_pos = step_pos[:, -1:] + 1
            attention = torch.cat([attention, attention.new_ones((batch_size, 1))], dim=1)

    def _results(
        self,
        requests: list[GenerationRequest],
        contexts: list[list[int]],
        new_ids: list[list[int]],
        new_logps: list[list[float]],
        stop: list[str | None],
        routes: list[list[list[list[int]]]],
        with_routes: bool,
    ) -> list[GenerationResult]:
        return [
            GenerationResult(
                request_id=r.request_id,
                prompt_ids=list(r.prompt_ids),
                response_ids=list(r.response_prefix) + new_ids[i],
                log_probs=new_logps[i],
                token_versions=[self.version] * len(new_ids[i]),
                stop_reason=stop[i] or "aborted",  # type: ignore[arg-type]
                routes=self._finish_routes(routes[i], len(contexts[i]) + len(new_ids[i])) if with_routes else None,
            )
            for i, r in enumerate(requests)
        ]

    def _route_hooks(self, chosen: list[torch.Tensor]) -> list[Any]:
        """Hooks on each MoE layer's router that keep the experts it chose (its third output)."""
        return [
            module.register_forward_hook(lambda _module, _inputs, out: chosen.append(out[2]))
            for name, module in self.model.named_modules()
            if name.endswith("mlp.gate")
        ]

    def _keep_routes(
        self,
        chosen: list[torch.Tensor],
        shape: torch.Size,
        routes: list[list[list[list[int]]]],
        contexts: list[list[int]] | None,
    ) -> None:
        """Append each row's experts for the tokens just fed: the whole context at the first
        step (its left padding skipped), then each row's last sampled token."""
        rows, width = shape
        layers = len(chosen)
        per_row = torch.stack(chosen).reshape(layers, rows, width, self.moe_top_k).permute(1, 2, 0, 3).tolist()
        chosen.clear()
        for i in range(rows):
            if contexts is not None:
                routes[i].extend(per_row[i][width - len(contexts[i]) :])
            else:  # a row that stopped earlier feeds a token of no response: cut off in _finish_routes
                routes[i].extend(per_row[i])

    def _finish_routes(self, fed: list[list[list[int]]], length: int) -> list[list[list[int]]]:
        """Routes for ``length`` tokens: the fed ones', then experts 0..k-1 for any token the
        model never saw (the last sampled one: its output feeds no log-prob)."""
        layers = len(fed[0]) if fed else int(self.model.config.num_hidden_layers)
        filler = [list(range(self.moe_top_k)) for _ in range(layers)]
        return fed[:length] + [filler] * max(length - len(fed), 0)

    # -- lifecycle (R-5.3) --------------------------------------------------------------
    def abort(self) -> int:
        """Stop in-flight generation; returns how many requests were in flight."""
        self._abort.set()
        with self._state:
            return self._in_flight

    def _quiesce(self) -> None:
        """Abort and wait until no batch decodes: every KV cache has been dropped then.

        The caller holds ``_state`` and has already set the flag that keeps new batches out.
        """
        while self._in_flight:
            self._abort.set()
            self._state.wait(0.05)

    def sleep(self) -> None:
        """Free the KV cache and move the weights to pinned host memory until ``wake_up``."""
        with self._state:
            if self._asleep:
                return
            self._asleep = True
            self._quiesce()
            if self.device != HOST:
                _move_weights(self.model, HOST)
                torch.cuda.empty_cache()

    def wake_up(self) -> None:
        with self._state:
            if not self._asleep:
                return
            if self.device != HOST:
                _move_weights(self.model, self.device)
            self._asleep = False

    def release_kv_cache(self) -> None:
        """Keep weights, free the KV cache: abort and wait until no batch holds one."""
        with self._state:
            self._kv_released = True
            self._quiesce()

    def resume_kv_cache(self) -> None:
        with self._state:
            self._kv_released = False

    def reset_prefix_cache(self) -> None:
        """No prefix cache survives a request here, so nothing from an old version can leak."""
        return None

    # -- weights ------------------------------------------------------------------------
    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Load HF-named tensors in place (on the device, or on the host while asleep); serve ``version``."""
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

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named tensors as loaded; tied weights appear under each of their names."""
        for name, tensor in self.model.state_dict().items():
            yield name, tensor.detach()

    def _storages(self, caller: str, items: Iterable[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
        """(storage, *rest) for every (HF name, *rest) item."""
        storages = self.model.state_dict(keep_vars=True)  # tied weights under every name
        for name, *rest in items:
            dest = storages.get(name)
            if dest is None:
                raise KeyError(f"{caller}: the rollout model has no tensor named {name!r}")
            yield dest, *rest


def _move_weights(model: torch.nn.Module, device: torch.device) -> None:
    """Move parameters and buffers to ``device`` in place (pinned when it is the host).

    ``parameters()`` and ``buffers()`` de-duplicate, so a tied weight moves once and stays
    tied; the old storage is freed as soon as its last reference (``.data``) is replaced.
    """
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if device == HOST:
                host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=torch.cuda.is_available())
                tensor.data = host.copy_(tensor)
            else:
                tensor.data = tensor.data.to(device, non_blocking=True)
    if device != HOST:
        torch.cuda.synchronize(device)
