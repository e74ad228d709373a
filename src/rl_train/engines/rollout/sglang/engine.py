"""``rollout.engine: sglang``: the ``RolloutEngine`` contract on an sglang server, over HTTP.

- **Generate.** One ``/generate`` call per batch: token ids in (prompt, then the response
  prefix of a continued partial rollout), and out, per new token, its id and log-prob
  (``return_logprob``). ``max_new_tokens`` counts the whole response, prefix included, as
  the built-in engine does. Each request gets its own sampling seed, drawn from this
  replica's stream (or from the call's ``seed``), so the n samples of one prompt differ and a
  restored stream draws the same seeds again. sglang's ``stop`` / ``length`` / ``abort``
  finish reasons are ``eos`` / ``length`` / ``aborted``.
- **Abort, sleep, wake.** ``/abort_request`` (every request of this replica's server);
  ``sleep`` aborts, waits for the batch in flight to return, and releases the KV cache and
  the weights (``/release_memory_occupation``); ``release_kv_cache`` releases the cache only.
- **Weights** (``rollout.sglang.weight_update``). ``disk``: the HF-named tensors are written
  as one safetensors file beside the policy's config and tokenizer in a staging folder, and
  the server loads them (``/update_weights_from_disk``). ``distributed``: the server joins a
  two-party ``torch.distributed`` group with this replica (``/init_weights_update_group``),
  and each update broadcasts the tensors over it while ``/update_weights_from_distributed``
  tells the server their names, dtypes and shapes. Either way the server flushes its prefix
  cache and records the version; an update while asleep is applied at ``wake_up``.
- **LoRA adapters synced alone** (``actor.lora``; ``lora.py``). They are written as a PEFT
  adapter folder in the staging folder (whichever ``weight_update``: they are megabytes),
  loaded by sglang's own LoRA (``/load_lora_adapter``) under a new name per version, the
  previous one unloaded, and every ``/generate`` then names it (``lora_path``). The server is
  launched with ``--enable-lora``, ``--max-lora-rank`` and ``--lora-target-modules`` from
  ``rollout.sglang.lora``, which a run fills from ``actor.lora``. A partial sync (``delta``)
  completes the adapter last synced; while asleep the folder is staged and loaded at
  ``wake_up``; full weights replace the adapter (it is unloaded, as the built-in engine's
  layers forget theirs). A sync mixing adapters and full weights is refused.
- **Failures.** Every server error is a ``RolloutServerError`` naming the endpoint and the
  cause; a failed generate returns nothing, and the rollout worker hands the batch's prompts
  back (tagged for retry).

``export_weights`` reads the served weights back (``/get_weights_by_name``, whole tensors):
slow, for checks, not for the training loop. An adapter served is merged into them (W0 + B A,
as the built-in engine holds it), since sglang keeps it beside the base weights.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from rl_train.engines.rollout.protocol import (
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    check_can_generate,
)
from rl_train.engines.rollout.sglang.client import RolloutServerError, SglangClient
from rl_train.engines.rollout.sglang.config import SglangConfig
from rl_train.engines.rollout.sglang.launch import LaunchedServer
from rl_train.engines.rollout.sglang.lora import ServedAdapter, is_adapter_sync
from rl_train.engines.rollout.sglang.weight_group import GROUP_NAME, broadcast_weights, open_group
from rl_train.engines.weight_sync.base import NamedTensors

STOP_REASONS = {"stop": "eos", "length": "length", "abort": "aborted"}
POLICY_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                     "special_tokens_map.json", "vocab.json", "merges.txt")  # fmt: skip
"""What a staged weight folder carries besides the weights, so that it loads as a model."""
SEED_RANGE = 2**31 - 1


def stored_tensor_layout(model_path: Path) -> dict[str, tuple[torch.dtype, list[int]]]:
    """Every tensor the policy's safetensors hold: name -> (dtype, shape), from the headers."""
    from safetensors import safe_open

    layout = {}
    for file in sorted(model_path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (a safetensors handle has no __iter__)
                piece = handle.get_slice(name)
                layout[name] = (getattr(torch, _dtype_name(piece.get_dtype())), list(piece.get_shape()))
    return layout


def _dtype_name(safetensors_dtype: str) -> str:
    return {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64"}[
        safetensors_dtype
    ]


class SglangRolloutEngine:
    def __init__(self, model_path: str | Path, *, seed: int = 0, options: dict[str, Any] | None = None) -> None:
        from rl_train.engines.model.tokenizer import load_tokenizer

        self.cfg = SglangConfig.model_validate(options or {})
        self.model_path = Path(model_path)
        self.tokenizer = load_tokenizer(self.model_path)
        self.hf_config = json.loads((self.model_path / "config.json").read_text())
        lora_args = self.cfg.lora.launch_args() if self.cfg.lora is not None else []
        self._server = (
            None
            if self.cfg.url
            else LaunchedServer(self.model_path, seed, [*lora_args, *self.cfg.launch_args], self.cfg.startup_timeout_s)
        )
        self.client = SglangClient(
            self.cfg.url or self._server.url,  # type: ignore[union-attr]
            self.cfg.connect_timeout_s,
            self.cfg.request_timeout_s,
        )
        self.version = 0
        self._generator = torch.Generator().manual_seed(seed)
        self._state = threading.Condition()
        self._in_flight = 0
        self._asleep = False
        self._kv_released = False
        self._staged: Path | None = None
        """Weights written while asleep, loaded by ``wake_up``."""
        self._served: Path | None = None
        """The folder of the full weights served (kept while they are)."""
        self._staging_root = Path(self.cfg.staging_dir or tempfile.mkdtemp(prefix="rlt-sglang-weights-"))
        self._owns_staging = self.cfg.staging_dir is None
        self.adapter = ServedAdapter(self.client, self._staging_root, self.model_path, self.cfg.lora)
        """The LoRA adapter served, if any (``lora.py``)."""
        self._group: Any = None
        self._tag = uuid.uuid4().hex[:8]

    def close(self) -> None:
        """Leave the weight group, unload the adapter from a server attached to, close the
        connection, stop a launched server, drop staged weights and adapters."""
        if self._server is None:
            self.adapter.close()
        if self._group is not None:
            with contextlib.suppress(RolloutServerError):
                self.client.call("/destroy_weights_update_group", {"group_name": GROUP_NAME})
            self._group = None
        self.client.close()
        if self._server is not None:
            self._server.stop()
        if self._owns_staging:
            shutil.rmtree(self._staging_root, ignore_errors=True)
        else:
            self._served, self._staged, self.adapter.folder, self.adapter.staged = None, None, None, None
            self._prune()

    # -- sampling stream ------------------------------------------------------------------
    def sampling_state(self) -> torch.Tensor:
        return self._generator.get_state()

    def load_sampling_state(self, state: torch.Tensor) -> None:
        self._generator.set_state(state)

    def _seeds(self, count: int, seed: int | None) -> list[int]:
        generator = self._generator if seed is None else torch.Generator().manual_seed(seed)
        return torch.randint(0, SEED_RANGE, (count,), generator=generator).tolist()

    # -- generation -----------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        with self._state:
            check_can_generate(self._asleep, self._kv_released)
            self._in_flight += len(requests)
        try:
            return self._generate(requests, params)
        finally:
            with self._state:
                self._in_flight -= len(requests)
                self._state.notify_all()

    def _generate(self, requests: list[GenerationRequest], params: SamplingParams) -> list[GenerationResult]:
        budgets = [params.max_new_tokens - len(r.response_prefix) for r in requests]
        live = [i for i, budget in enumerate(budgets) if budget > 0]
        seeds = self._seeds(len(requests), params.seed)
        version, adapter = self.version, self.adapter.name
        outputs: dict[int, dict[str, Any]] = {}
        if live:
            body = {
                "rid": [f"{requests[i].request_id}#{self._tag}-{uuid.uuid4().hex[:8]}" for i in live],
                "input_ids": [list(requests[i].prompt_ids) + list(requests[i].response_prefix) for i in live],
                "sampling_params": [
                    {
                        "temperature": params.temperature,
                        "top_p": params.top_p,
                        "max_new_tokens": budgets[i],
                        "ignore_eos": params.ignore_eos,
                        "sampling_seed": seeds[i],
                    }
                    for i in live
                ],
                "return_logprob": True,
                "stream": False,
            }
            if adapter is not None:
                body["lora_path"] = adapter
            answer = self.client.call("/generate", body)
            if not isinstance(answer, list) or len(answer) != len(live):
                raise self._malformed(f"expected a list of {len(live)} results, got {_kind(answer)}")
            outputs = dict(zip(live, answer, strict=True))
        results = []
        for i, request in enumerate(requests):
            if i not in outputs:  # the prefix already fills the budget
                results.append(
                    GenerationResult(request.request_id, list(request.prompt_ids), list(request.response_prefix), [], [], "length")
                )
                continue
            tokens, log_probs, reason = self._parse(outputs[i])
            results.append(
                GenerationResult(
                    request.request_id,
                    list(request.prompt_ids),
                    list(request.response_prefix) + tokens,
                    log_probs,
                    [version] * len(tokens),
                    reason,  # type: ignore[arg-type]
                )
            )
        return results

    def _malformed(self, problem: str) -> RolloutServerError:
        return RolloutServerError(f"sglang server {self.client.url}/generate: malformed answer: {problem}")

    def _parse(self, output: Any) -> tuple[list[int], list[float], str]:
        meta = output.get("meta_info") if isinstance(output, dict) else None
        if not isinstance(meta, dict):
            raise self._malformed(f"a result without meta_info: {str(output)[:200]}")
        entries = meta.get("output_token_logprobs")
        finish = meta.get("finish_reason") or {}
        kind = finish.get("type") if isinstance(finish, dict) else None
        reason = STOP_REASONS.get(kind) if isinstance(kind, str) else None
        if not isinstance(entries, list) or reason is None:
            raise self._malformed(f"output_token_logprobs {_kind(entries)}, finish_reason {finish!r}")
        tokens, log_probs = [], []
        for entry in entries:
            if not (isinstance(entry, list | tuple) and len(entry) >= 2 and isinstance(entry[1], int)):
                raise self._malformed(f"an output_token_logprobs entry {entry!r} is not [log-prob, token id, ...]")
            if not isinstance(entry[0], int | float):
                raise self._malformed(f"token {entry[1]} has log-prob {entry[0]!r}")
            log_probs.append(float(entry[0]))
            tokens.append(int(entry[1]))
        if "output_ids" in output and list(output["output_ids"]) != tokens:
            raise self._malformed("output_ids disagree with output_token_logprobs")
        return tokens, log_probs, reason

    @property
    def kv_reused_tokens(self) -> int:
        """Always 0: the server's own prefix cache reuses what it can, and does not say how much."""
        return 0

    def running_requests(self) -> int:
        """Requests the server is working on now, over its data-parallel ranks (``/get_load``)."""
        load = self.client.call("/get_load", method="GET")
        ranks = load if isinstance(load, list) else [load]
        try:
            return sum(int(rank.get("num_reqs", 0)) for rank in ranks)
        except (AttributeError, TypeError, ValueError):
            raise RolloutServerError(f"sglang server {self.client.url}/get_load: malformed answer {load!r}") from None

    def abort(self) -> int:
        """Abort every request in flight on the server; returns how many this replica had."""
        with self._state:
            in_flight = self._in_flight
        self.client.call("/abort_request", {"abort_all": True})
        return in_flight

    def _quiesce(self) -> None:
        self.abort()
        with self._state:
            self._state.wait_for(lambda: self._in_flight == 0)

    # -- memory ---------------------------------------------------------------------------
    def sleep(self) -> None:
        if self._asleep:
            return
        self._quiesce()
        tags = ["weights"] if self._kv_released else ["kv_cache", "weights"]
        self.client.call("/release_memory_occupation", {"tags": tags})
        self._asleep = True

    def wake_up(self) -> None:
        if not self._asleep:
            return
        tags = ["weights"] if self._kv_released else ["kv_cache", "weights"]
        self.client.call("/resume_memory_occupation", {"tags": tags})
        self._asleep = False
        if self._staged is not None:
            staged, self._staged = self._staged, None
            self._load_from_disk(staged, self.version)
        if self.adapter.staged is not None:
            (folder, adapter), self.adapter.staged = self.adapter.staged, None
            self.adapter.load(folder, adapter)
            self._prune()

    def release_kv_cache(self) -> None:
        if self._kv_released or self._asleep:
            self._kv_released = True
            return
        self._quiesce()
        self.client.call("/release_memory_occupation", {"tags": ["kv_cache"]})
        self._kv_released = True

    def resume_kv_cache(self) -> None:
        if not self._kv_released:
            return
        if not self._asleep:
            self.client.call("/resume_memory_occupation", {"tags": ["kv_cache"]})
        self._kv_released = False

    def reset_prefix_cache(self) -> None:
        self.client.call("/flush_cache")

    # -- weights --------------------------------------------------------------------------
    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        items = list(named_tensors)
        if is_adapter_sync(items):
            self._update_adapter(items, version)
        elif self.cfg.weight_update == "distributed" and not self._asleep:
            self._update_distributed(items, version)
            self._served = None  # the weights on disk are no longer those served
            self.adapter.drop()
            self._prune()
        else:
            folder = self._stage(items, version)
            if self._asleep:
                self._staged, self.adapter.held, self.adapter.staged = folder, {}, None  # the adapter goes at wake-up
                self._prune()
            else:
                self._load_from_disk(folder, version)
        self.version = version

    def _update_adapter(self, items: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Serve the adapter (``lora.py``), or stage it while asleep."""
        if self._server is not None and self.cfg.lora is None:
            raise ValueError(
                "LoRA adapters arrived, and this replica launched its sglang server without LoRA: "
                "rollout.sglang.lora is not set (a run fills it from actor.lora)"
            )
        folder, adapter = self.adapter.write(items, version)
        if self._asleep:
            self.adapter.staged = (folder, adapter)
        else:
            self.adapter.load(folder, adapter)
        self._prune()

    def _stage(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> Path:
        """The tensors as a loadable model folder: weights, config, tokenizer."""
        from safetensors.torch import save_file

        folder = self._staging_root / f"v{version}-{uuid.uuid4().hex[:8]}"
        folder.mkdir(parents=True)
        tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in named_tensors}
        if self.hf_config.get("tie_word_embeddings"):
            tensors.pop("lm_head.weight", None)  # one tensor on disk; the loader ties it
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        for name in POLICY_SIDE_FILES:
            if (self.model_path / name).exists():
                shutil.copyfile(self.model_path / name, folder / name)
        return folder

    def _load_from_disk(self, folder: Path, version: int) -> None:
        try:
            self.client.call(
                "/update_weights_from_disk",
                {"model_path": str(folder), "weight_version": str(version), "flush_cache": True},
            )
        except RolloutServerError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._served = folder
        self.adapter.drop()
        self._prune()

    def _prune(self) -> None:
        """Only what is served or staged stays on disk."""
        keep = {f for f in (self._served, self._staged) if f is not None} | self.adapter.folders()
        for old in self._staging_root.glob("v*"):
            if old not in keep:
                shutil.rmtree(old, ignore_errors=True)

    def _update_distributed(self, tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        if self._group is None:
            self._group, self._store = open_group(self.client, self.cfg)
        broadcast_weights(self.client, self._group, tensors, version)

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The served weights, HF-named, whole, in the policy's stored dtypes (an adapter served
        merged in)."""
        return self.adapter.merged_into(self._read_weights())

    def _read_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The server's own weights (without an adapter: sglang keeps it apart)."""
        layout = stored_tensor_layout(self.model_path)
        if self.hf_config.get("tie_word_embeddings") and "lm_head.weight" not in layout:
            layout["lm_head.weight"] = layout["model.embed_tokens.weight"]
        for name, (dtype, shape) in layout.items():
            numel = 1
            for size in shape:
                numel *= size
            values = self.client.call("/get_weights_by_name", {"name": name, "truncate_size": numel})
            try:
                yield name, torch.tensor(values, dtype=dtype).reshape(shape)
            except (TypeError, ValueError, RuntimeError) as error:
                raise RolloutServerError(
                    f"sglang server {self.client.url}/get_weights_by_name: {name} is not a {shape} tensor ({error})"
                ) from None


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {str(value)[:120]}"
