"""The built-in rollout engine: batched sampling on torch with a KV cache, on CPU or one GPU.

Requests are left-padded into one batch; positions come from the attention mask so that a
padded row computes exactly what it would alone, and what the training engine computes on
the right-padded sequence. ``abort`` may be called from another thread (a Ray actor with
concurrency > 1): the decode loop stops at the next token and every request returns what it
has with stop_reason "aborted".

Memory. The KV cache of a batch lives only while the batch decodes: it is built for the
batch and dropped when the batch returns. What outlives a batch is what requests asked to
keep for their next turn (``GenerationRequest.keep_kv``, ``kept_kv.py``): their own tokens'
keys and values, copied out, bounded by ``keep_kv_mib`` and dropped whenever the weights change.
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

from rl_train.engines.model.loading import is_native, load_policy, new_kv_cache
from rl_train.engines.model.native import fuse_projections, unfuse_projections
from rl_train.engines.model.native_decode import (
    DecodeWeights,
    can_decode_fast,
    decode_logits,
    decode_weights,
    generation_bias,
)
from rl_train.engines.rollout.kept_kv import DEFAULT_MAX_MIB, KeptEntry, KeptKV, assemble, gather_group
from rl_train.engines.rollout.lora_merge import AdapterMerger
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
        keep_kv_mib: int = DEFAULT_MAX_MIB,
    ) -> None:
        self.device = torch.device(device)
        model, self.tokenizer = load_policy(model_path, impl=model_impl)
        self.model = model.to(self.device).eval()
        self._native = is_native(self.model)
        """The plain-torch model: its forward keeps only the logits asked for, its KV cache
        can repeat rows (a prompt repeated in a batch is prefilled once), and its q/k/v and
        gate/up projections run as one matmul each (``fuse_projections``)."""
        if self._native:
            fuse_projections(self.model)
        self.fast_decode = True
        """Decode steps of the native model through ``native_decode`` (False: its module forward)."""
        self._fused = self._native and can_decode_fast(self.model)
        """Whether the projections are stacked now (``sleep`` on a GPU unstacks them, ``wake_up``
        restacks them): checked there, not at every decode step."""
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
        self.kept = KeptKV(keep_kv_mib << 20 if self._native else 0)
        """Keys and values requests kept for their next turn (the native model's cache only)."""
        self.adapters = AdapterMerger(self.model)
        """LoRA adapters synced alone, merged into the weights they adapt."""

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

    @torch.inference_mode()
    def _generate_batch(
        self, requests: list[GenerationRequest], params: SamplingParams, generator: torch.Generator
    ) -> list[GenerationResult]:
        """Decode one left-padded batch; its KV cache is a local and dies with this call (what
        its requests asked to keep is copied out at the end)."""
        contexts = [r.prompt_ids + r.response_prefix for r in requests]
        with_routes = params.return_routes and self.moe_top_k > 0
        budget = [max(params.max_new_tokens - len(r.response_prefix), 0) for r in requests]
        kept = None if with_routes or not any(budget) else self._take_kept(requests, contexts)
        if kept is None:
            input_ids, attention, positions = self._left_pad(contexts)
            cache = new_kv_cache(self.model, input_ids.shape[1] + max(budget, default=0))
            cache_width = input_ids.shape[1]
            fed = [(cache_width - len(c), cache_width, cache_width) for c in contexts]
            distinct = None if with_routes else self._distinct_rows(contexts)
        else:
            input_ids, attention, positions, cache, fed = self._continue_kept(contexts, kept, max(budget, default=0))
            cache_width = attention.shape[1]
            distinct = None
        new_ids: list[list[int]] = [[] for _ in requests]
        new_logps: list[list[float]] = [[] for _ in requests]
        stop: list[str | None] = [None if b > 0 else "length" for b in budget]
        routes: list[list[list[list[int]]]] = [[] for _ in requests]  # per row: per fed token, [L][k]
        chosen: list[torch.Tensor] = []  # each MoE layer's experts for the tokens of the last forward
        hooks = self._route_hooks(chosen) if with_routes else []
        try:
            ran = self._decode(
                requests, params, generator, input_ids, attention, positions, cache, distinct, contexts, budget,
                new_ids, new_logps, stop, routes, chosen, with_routes,
            )  # fmt: skip
        finally:
            for hook in hooks:
                hook.remove()
        if ran and not with_routes:
            self._keep(requests, contexts, new_ids, cache, fed, cache_width)
        return self._results(requests, contexts, new_ids, new_logps, stop, routes, with_routes)

    # -- keys and values kept between turns (kept_kv.py) --------------------------------
    def _take_kept(self, requests: list[GenerationRequest], contexts: list[list[int]]) -> list[KeptEntry | None] | None:
        """Each request's kept entry that its context continues (None where it has none), or
        None when no request has one."""
        if not len(self.kept):
            return None
        entries = [self.kept.take(r.request_id, c, self.version) for r, c in zip(requests, contexts, strict=True)]
        return entries if any(e is not None for e in entries) else None

    def _continue_kept(
        self, contexts: list[list[int]], kept: list[KeptEntry | None], new_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any, list[tuple[int, int, int]]]:
        """(input_ids, attention, positions, cache, fed spans) of a batch whose rows continue
        kept keys and values. The cache holds each row's kept tokens right-aligned in a width W;
        the rows' new tokens follow, left-padded in their own width, so a row's mask has a hole
        between the two: positions count the row's real tokens only, so each token is where it
        would be alone. A row's span (a, b, c): its kept tokens at cache positions [a, b), its
        new ones from c to the end of the layout."""
        lengths = [len(e.tokens) if e is not None else 0 for e in kept]
        self.kept.reused_tokens += sum(lengths)
        suffixes = [c[n:] for c, n in zip(contexts, lengths, strict=True)]
        width, new_width = max(lengths), max(len(s) for s in suffixes)
        input_ids = torch.tensor(
            [[self.pad_token_id] * (new_width - len(s)) + s for s in suffixes], dtype=torch.long, device=self.device
        )
        fed = [(width - n, width, width + new_width - len(s)) for n, s in zip(lengths, suffixes, strict=True)]
        starts = torch.tensor(fed)
        at = torch.arange(width + new_width)[None, :]
        attention = ((at >= starts[:, :1]) & (at < width)) | (at >= starts[:, 2:])
        attention = attention.long().to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, width:]
        keys, values = assemble(kept, width + new_width + new_tokens)
        cache = new_kv_cache(self.model)
        cache.adopt(keys, values, width)
        return input_ids, attention, positions, cache, fed

    def _keep(
        self,
        requests: list[GenerationRequest],
        contexts: list[list[int]],
        new_ids: list[list[int]],
        cache: Any,
        fed: list[tuple[int, int, int]],
        width: int,
    ) -> None:
        """Copy out the keys and values of each request that asked to keep them: its context's
        (at cache positions [a, b) and [c, ``width``) of its span) and its generated tokens'
        but the last (sampled, never fed; from ``width`` on)."""
        rows = [i for i, r in enumerate(requests) if r.keep_kv] if self.kept.max_bytes > 0 else []
        if not rows:
            return
        kept_new = [max(len(new_ids[i]) - 1, 0) for i in rows]
        spans = [(*fed[i], width + n) for i, n in zip(rows, kept_new, strict=True)]
        group = gather_group(cache.keys, cache.values, rows, spans)
        for j, (i, n) in enumerate(zip(rows, kept_new, strict=True)):
            self.kept.put(requests[i].request_id, KeptEntry(self.version, contexts[i] + new_ids[i][:n], group, j))

    def _left_pad(self, contexts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(input_ids, attention mask, positions) of the left-padded batch, on the device; the
        mask is None when no row is padded (every key is then a real token)."""
        lengths = [len(c) for c in contexts]
        width = max(lengths)
        input_ids = torch.tensor([[self.pad_token_id] * (width - len(c)) + c for c in contexts], dtype=torch.long)
        pads = torch.tensor([width - n for n in lengths], dtype=torch.long)
        attention = (torch.arange(width)[None, :] >= pads[:, None]).long()
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        padded = any(n != width for n in lengths)
        return input_ids, attention if padded else None, positions

    def _distinct_rows(self, contexts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(first row of each distinct context, each row's distinct context) when some rows
        repeat a context and the model's cache can repeat rows; else None."""
        if not self._native:
            return None
        distinct: dict[tuple[int, ...], int] = {}
        first: list[int] = []
        inverse: list[int] = []
        for i, context in enumerate(contexts):
            index = distinct.setdefault(tuple(context), len(first))
            if index == len(first):
                first.append(i)
            inverse.append(index)
        if len(first) == len(contexts):
            return None
        return torch.tensor(first, device=self.device), torch.tensor(inverse, device=self.device)

    def _next_logits(
        self,
        ids: torch.Tensor,
        attention: torch.Tensor | None,
        positions: torch.Tensor,
        cache: Any,
        bias: torch.Tensor | None = None,
        weights: DecodeWeights | None = None,
    ) -> torch.Tensor:
        """Logits [B, V] of the token after each row, the rows' keys and values added to ``cache``.
        A decode step of the native model (one token per row) skips its modules: the same
        kernels on the same numbers (``native_decode``), 0.93-0.96x the time of a generation at
        256 rows x 32 tokens, and compiled by TorchScript (``scripted.py``) 0.89x of that. ``bias``: the generation's ``generation_bias``, which a fast
        decode step reads in place of ``attention``; ``weights``: the generation's
        ``decode_weights``."""
        if ids.shape[1] == 1 and self.fast_decode and self._fused:
            return decode_logits(self.model, ids, attention, positions, cache, bias, weights)
        keep = {"logits_to_keep": 1} if self._native else {}
        out = self.model(
            input_ids=ids, attention_mask=attention, position_ids=positions, cache=cache, use_cache=True, **keep
        )
        return out.logits[:, -1]

    def _prefill_distinct(
        self,
        ids: torch.Tensor,
        attention: torch.Tensor | None,
        positions: torch.Tensor,
        cache: Any,
        rows: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """``_next_logits`` of the whole batch from a forward of its distinct contexts only:
        each row's keys, values and logits are those of its context's first row."""
        first, inverse = rows
        logits = self._next_logits(
            ids[first], None if attention is None else attention[first], positions[first], cache
        )
        cache.select_rows(inverse)
        return logits.index_select(0, inverse)

    def _decode(
        self,
        requests: list[GenerationRequest],
        params: SamplingParams,
        generator: torch.Generator,
        input_ids: torch.Tensor,
        attention: torch.Tensor | None,
        positions: torch.Tensor,
        cache: Any,
        distinct: tuple[torch.Tensor, torch.Tensor] | None,
        contexts: list[list[int]],
        budget: list[int],
        new_ids: list[list[int]],
        new_logps: list[list[float]],
        stop: list[str | None],
        routes: list[list[list[list[int]]]],
        chosen: list[torch.Tensor],
        with_routes: bool,
    ) -> bool:
        """The decode loop: sample into ``new_ids`` / ``new_logps`` until every row stops.
        Whether any forward ran (an abort before the first, or no budget, runs none)."""
        batch_size = len(requests)
        rows = _Rows(budget, None if params.ignore_eos else self.eos_token_id, self.device)
        step_ids, step_pos = input_ids, positions
        steps = max(budget, default=0)
        # a fast decode step reads the whole generation's mask as one bias, made once here
        fast = self.fast_decode and self._fused
        bias = generation_bias(attention, steps) if attention is not None and fast else None
        weights = decode_weights(self.model) if fast else None  # gathered once: written in place meanwhile
        for step in range(steps):
            if self._abort.is_set():
                break
            if step == 0 and distinct is not None:
                logits = self._prefill_distinct(step_ids, attention, step_pos, cache, distinct)
            else:
                logits = self._next_logits(step_ids, attention, step_pos, cache, bias, weights)
            if with_routes:
                self._keep_routes(chosen, step_ids.shape, routes, contexts if step == 0 else None)
            tokens, logps = sample_tokens(logits, params.temperature, params.top_p, generator)
            if not rows.add(step, tokens, logps):
                break
            step_ids = tokens[:, None]
            step_pos = step_pos[:, -1:] + 1
            if attention is not None and bias is None:
                attention = torch.cat([attention, attention.new_ones((batch_size, 1))], dim=1)
        rows.finish(new_ids, new_logps, stop)
        return bool(rows.tokens)

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
            self.kept.clear()
            if self.device != HOST:
                if self._native:
                    unfuse_projections(self.model)  # moving the weights cuts them from their stacks
                    self._fused = False
                    self.model.model.__dict__.pop("_rope_by_position", None)  # decode's RoPE tables
                _move_weights(self.model, HOST)
                torch.cuda.empty_cache()

    def wake_up(self) -> None:
        with self._state:
            if not self._asleep:
                return
            if self.device != HOST:
                _move_weights(self.model, self.device)
                if self._native:
                    fuse_projections(self.model)
                    self._fused = can_decode_fast(self.model)
            self._asleep = False

    def release_kv_cache(self) -> None:
        """Keep weights, free the KV cache: abort and wait until no batch holds one."""
        with self._state:
            self._kv_released = True
            self._quiesce()
            self.kept.clear()

    def resume_kv_cache(self) -> None:
        with self._state:
            self._kv_released = False

    def reset_prefix_cache(self) -> None:
        """Forget the keys and values kept between turns (they are also forgotten on every
        weight load, and never used under another version)."""
        self.kept.clear()

    @property
    def kv_reused_tokens(self) -> int:
        """Context tokens that continued kept keys and values instead of being prefilled again."""
        return self.kept.reused_tokens

    def close(self) -> None:
        """Nothing outlives the process: the weights and kept keys go with the engine."""

    # -- weights ------------------------------------------------------------------------
    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Load HF-named tensors in place (on the device, or on the host while asleep); serve
        ``version``. LoRA adapters synced alone are merged into their layers (``lora_merge``)."""
        with torch.no_grad():
            items = self.adapters.route(named_tensors, lambda held, rest: held.copy_(rest[0]))
            for dest, tensor in self._storages("update_weights", items):
                dest.copy_(tensor)
            self.adapters.merge()
        self.kept.clear()
        self.version = version

    def update_weights_sparse(self, updates: SparseUpdates, version: int) -> None:
        """Overwrite the given flat positions of HF-named tensors (or of adapters synced alone,
        then merged again) in place; serve ``version``."""
        with torch.no_grad():
            items = self.adapters.route(updates, lambda held, rest: write_entries(held, rest[0], rest[1]))
            for dest, index, values in self._storages("update_weights_sparse", items):
                write_entries(dest, index, values)
            self.adapters.merge()
        self.kept.clear()
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


class _Rows:
    """Which rows of a batch still sample, kept as tensors on the device: each step's tokens
    and log-probs are stored whole and cut into per-row lists once, when the batch ends
    (no per-row Python work per token)."""

    def __init__(self, budget: list[int], eos: int | None, device: torch.device) -> None:
        self.budget = torch.tensor(budget, dtype=torch.long, device=device)
        self.eos = eos
        self.live = self.budget > 0
        """Rows still sampling (no EOS yet, budget left, no abort)."""
        self.hit_eos = torch.zeros_like(self.live)
        self.lengths = torch.zeros_like(self.budget)
        """Tokens each row has kept so far."""
        self.tokens: list[torch.Tensor] = []
        self.log_probs: list[torch.Tensor] = []

    def add(self, step: int, tokens: torch.Tensor, log_probs: torch.Tensor) -> bool:
        """Keep step ``step``'s samples for the rows still sampling; whether any row still samples."""
        self.tokens.append(tokens)
        self.log_probs.append(log_probs)
        self.lengths += self.live
        if self.eos is not None:
            ended = self.live & (tokens == self.eos)
            self.hit_eos |= ended
            self.live &= ~ended
        self.live &= self.budget > step + 1
        return bool(self.live.any())

    def finish(self, new_ids: list[list[int]], new_logps: list[list[float]], stop: list[str | None]) -> None:
        """Each row's kept tokens and log-probs, and why it stopped (still sampling: aborted)."""
        if not self.tokens:  # no step ran: aborted before the first, or no budget at all
            stop[:] = ["aborted" if live else "length" for live in self.live.tolist()]
            return
        ids = torch.stack(self.tokens, dim=1).tolist()
        logps = torch.stack(self.log_probs, dim=1).tolist()
        ends = zip(self.lengths.tolist(), self.hit_eos.tolist(), self.live.tolist(), strict=True)
        for i, (length, eos, live) in enumerate(ends):
            new_ids[i] = ids[i][:length]
            new_logps[i] = logps[i][:length]
            stop[i] = "eos" if eos else "aborted" if live else "length"


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
