"""The plain-torch training engine (R-4.1-4.3): one DP rank, CPU or GPU (``actor.device``: the
policy lives there, batches go there per micro-batch, results come back to the host).

Data parallelism is manual and exact: each rank backpropagates the *numerator* of the loss
over its micro-batches, then gradients and denominators are summed over ranks
(``torch.distributed`` all-reduce, gloo on CPU) and gradients are divided once by the global
denominator. The update therefore does not depend on how the batch is cut into
micro-batches or ranks.

With ``actor.lora`` the policy is wrapped by PEFT (``lora.py``): only the adapters require grad,
so the optimizer, the gradient all-reduce, the clip, pi_old's snapshot and the checkpoint
carry them alone; the reference is this engine with the adapters off (``reference_is_base``).
With ``actor.fsdp`` too, ``fully_shard`` shards the frozen base weights and the adapters alike
(``sharding.py``) and reduce-scatters the adapters' gradients alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from rl_train.algorithms.teacher_fields import STUDENT_TOPK_LOG_PROBS, TEACHER_TOPK_IDS
from rl_train.engines.model.loading import load_policy, save_policy
from rl_train.engines.training import lora
from rl_train.engines.training.config import ActorConfig
from rl_train.engines.training.lazy_dynamo import optimizers_without_compiler, step_without_compiler
from rl_train.engines.training.micro_batch import length_sorted_micro_batches, split_micro_batches
from rl_train.engines.training.protocol import ROUTES, Batch, LossFn, RoutesNotSupportedError
from rl_train.engines.training.sharding import full, local, local_state, reshard_optimizer_state, shard_model
from rl_train.engines.training.snapshot import WeightSnapshots
from rl_train.engines.training.token_outputs import token_entropy, token_log_probs, token_topk_log_probs


def lr_lambda(cfg: ActorConfig, horizon_steps: int):
    def factor(step: int) -> float:
        if cfg.lr_warmup_steps and step < cfg.lr_warmup_steps:
            return (step + 1) / cfg.lr_warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        span = max(round(horizon_steps * cfg.lr_decay_ratio) - cfg.lr_warmup_steps, 1)
        progress = min(max(step - cfg.lr_warmup_steps, 0) / span, 1.0)
        decay = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.lr_schedule == "cosine" else 1 - progress
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay

    return factor


class TorchTrainingEngine:
    def __init__(
        self,
        model_path: str | Path,
        cfg: ActorConfig,
        horizon_steps: int,
        temperature: float = 1.0,
        seed: int = 0,
        model_impl: str = "auto",
    ) -> None:
        torch.manual_seed(seed)
        dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
        self.device = torch.device(cfg.device)
        self.model_path = Path(model_path)
        model, self.tokenizer = load_policy(model_path, dtype=dtype, impl=model_impl)
        self.model = model.to(self.device)
        self.lora = cfg.lora is not None
        self._base_checksum: str | None = None
        if cfg.lora is not None:
            self.model = lora.apply_lora(self.model, cfg.lora, self.model_path)
        self.cfg = cfg
        self.temperature = temperature
        self.horizon_steps = horizon_steps
        self.distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.sharded = bool(cfg.fsdp) and self.distributed
        if self.sharded:
            shard_model(self.model)
        optimizers_without_compiler()
        # foreach: one multi-tensor op per gradient scale and clip instead of one op per
        # parameter (on the CPU the step of a small model is otherwise hundreds of tiny ops).
        # fused: Adam's whole update in one kernel per parameter, where foreach still runs a
        # dozen multi-tensor ops: 0.88 ms against 3.06 ms a step for the demo policy on two
        # cores, the weights within 2.4e-7 of foreach's after 205 steps (``bench``-free check
        # in tests/unit/test_torch_engine_optimizer.py). Sharded (DTensor) parameters keep
        # torch's own choice.
        self._foreach = None if self.sharded else True
        # the parameters the optimizer steps, listed once (after sharding, which replaces them):
        # all of them, or with LoRA the adapters alone
        self._trainable = [param for param in self.model.parameters() if param.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self._trainable, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
            **({} if self.sharded else {"fused": True}),
        )  # fmt: skip
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg, horizon_steps))
        self._pi_old = WeightSnapshots()

    @property
    def data_parallel_rank(self) -> int:
        """Every rank holds (or, sharded, gathers) the whole model: its rank in the world."""
        return dist.get_rank() if self.distributed else 0

    @property
    def replays_routes(self) -> bool:
        """False: the torch engine's models route by their own router scores only."""
        return False

    @property
    def reference_is_base(self) -> bool:
        """With LoRA: the reference is this policy with its adapters off (``base=True``)."""
        return self.lora

    def _refuse_routes(self, batch: Batch, record_routes: bool = False) -> None:
        if record_routes or ROUTES in batch:
            raise RoutesNotSupportedError(
                "the torch training engine cannot record or replay MoE routes (actor.router_replay "
                "needs actor.engine megatron)"
            )

    # -- forward / backward --------------------------------------------------------------
    def _to_device(self, micro_batch: Batch) -> Batch:
        return {key: value.to(self.device) for key, value in micro_batch.items()}

    def _forward(self, micro_batch: Batch, with_entropy: bool) -> Batch:
        """Log-probs (and entropy) of a micro-batch already on the engine's device.

        A right-padded batch (each row's real tokens first, as ``collate`` lays them out) needs
        no attention mask: under the causal mask alone no real token sees a padding one, which
        all come after it, so its outputs are the same (bitwise, measured) while attention
        takes its fused causal kernel instead of a masked one."""
        mask = micro_batch["attention_mask"]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        right_padded = bool((mask[:, 1:] <= mask[:, :-1]).all()) if mask.shape[1] > 1 else True
        logits = self.model(
            input_ids=micro_batch["input_ids"], attention_mask=None if right_padded else mask, position_ids=positions
        ).logits
        out = {"log_probs": token_log_probs(logits, micro_batch["input_ids"], self.temperature)}
        if with_entropy:
            out["entropy"] = token_entropy(logits, self.temperature)
        if TEACHER_TOPK_IDS in micro_batch:  # a top-k distillation loss reads the student at those ids
            topk_ids = micro_batch[TEACHER_TOPK_IDS]
            out[STUDENT_TOPK_LOG_PROBS] = token_topk_log_probs(logits, topk_ids, self.temperature)
        return out

    @torch.no_grad()
    def compute_log_probs(
        self,
        batch: Batch,
        *,
        with_entropy: bool = False,
        pi_old: bool = False,
        record_routes: bool = False,
        base: bool = False,
    ) -> Batch:
        """Forward only, eval mode: per-token log-probs [B, T] (entropy too if asked).

        ``pi_old``: under the pinned pi_old weights when ``snapshot_pi_old`` pinned some
        (swapped in for the pass and swapped back bitwise), else under the current ones.
        ``base`` (LoRA only): with the adapters off, the base model's own outputs.
        ``record_routes`` (or a batch with ``routes``): refused, see ``replays_routes``.
        """
        self._refuse_routes(batch, record_routes)
        if base:
            if not self.lora:
                raise ValueError("base=True asks for the base model under LoRA adapters; this engine has none")
            with self.model.disable_adapter():
                return self._log_probs(batch, with_entropy)
        if pi_old and self._pi_old.active:
            with self._pi_old.swapped_in(self.model):
                return self._log_probs(batch, with_entropy)
        return self._log_probs(batch, with_entropy)

    def _log_probs(self, batch: Batch, with_entropy: bool) -> Batch:
        self.model.eval()
        width = batch["input_ids"].shape[1]
        parts: dict[str, list[torch.Tensor]] = {}
        micro_batches, order = self._cut(batch, self.cfg.infer_micro_batch_size)
        for index, micro in enumerate(self._matched(micro_batches, batch)):
            outputs = self._forward(self._to_device(micro), with_entropy)
            if index >= len(micro_batches):
                continue  # a filler: its forward only keeps this rank in step with the others
            for key, value in outputs.items():  # padded along the positions, dim 1
                pad = (0, 0) * (value.dim() - 2) + (0, width - value.shape[1])
                parts.setdefault(key, []).append(torch.nn.functional.pad(value.cpu(), pad))
        if not parts:  # no row here
            empty = torch.zeros(0, width)
            return {"log_probs": empty, **({"entropy": empty} if with_entropy else {})}
        out = {key: torch.cat(values) for key, values in parts.items()}
        if order is not None:  # back to the batch's order: row i of the passes is row order[i]
            for key, value in out.items():
                out[key] = torch.empty_like(value).index_copy_(0, order, value)
        return out

    def _cut(self, batch: Batch, rows: int | None) -> tuple[list[Batch], torch.Tensor | None]:
        """The micro-batches of a pass, and the order of their rows in ``batch`` when
        ``actor.sort_by_length`` reorders them (None: the batch's own order)."""
        if self.cfg.sort_by_length:
            return length_sorted_micro_batches(batch, rows, self.cfg.max_tokens_per_micro_batch)
        return split_micro_batches(batch, rows, self.cfg.max_tokens_per_micro_batch), None

    def _matched(self, micro_batches: list[Batch], batch: Batch) -> list[Batch]:
        """Sharded, every rank must run as many forward passes (each gathers the weights of
        every layer together): a rank with fewer micro-batches than the most any rank has gets
        fillers, one padded row each whose response mask is 0, so that it adds nothing."""
        if not self.sharded:
            return micro_batches
        count = torch.tensor([len(micro_batches)], device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        pad = int(self.tokenizer.pad_token_id)
        filler = {  # [B, T, ...]: one row, one position
            key: torch.zeros((1, 1, *value.shape[2:]), dtype=value.dtype)
            for key, value in batch.items()
            if value.dim() >= 2
        }
        filler["input_ids"] = torch.full((1, 1), pad, dtype=batch["input_ids"].dtype)
        filler["attention_mask"] = torch.ones((1, 1), dtype=batch["attention_mask"].dtype)
        return micro_batches + [filler] * (int(count) - len(micro_batches))

    def forward_backward_batch(
        self, batch: Batch, loss_fn: LossFn | None, forward_only: bool
    ) -> dict[str, object]:
        if forward_only:
            return dict(self.compute_log_probs(batch, with_entropy=self.cfg.entropy_coeff > 0))
        assert loss_fn is not None, "a training pass needs a loss_fn"
        return dict(self._backward(batch, loss_fn))

    def _backward(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        """Gradients of the batch's loss, summed over micro-batches and ranks and divided once by
        the global denominator (left on the parameters); the pass's metrics."""
        self.model.train()
        numerator_total = torch.zeros((), dtype=torch.float64)
        denominator_total = torch.zeros((), dtype=torch.float64)
        weighted: dict[str, float] = {}
        micro_batches, _ = self._cut(batch, self.cfg.micro_batch_size)  # the sums ignore row order
        passes = self._matched(micro_batches, batch)
        for index, micro in enumerate(passes):
            micro = self._to_device(micro)
            if self.sharded:  # reduce-scatter once, after the last micro-batch's backward
                self.model.set_requires_gradient_sync(index == len(passes) - 1)
            numerator, denominator, metrics = loss_fn(self._forward(micro, self.cfg.entropy_coeff > 0), micro)
            numerator.backward()
            numerator_total += numerator.detach().double().cpu()
            denominator_total += denominator
            tokens = float(micro["response_mask"].sum())
            for key, value in metrics.items():
                weighted[key] = weighted.get(key, 0.0) + value * tokens
        totals = torch.stack(
            [
                numerator_total,
                denominator_total,
                torch.tensor(float(batch["response_mask"].sum()), dtype=torch.float64),
            ]
        )
        totals = self._all_reduce_grads(totals)
        denominator = float(totals[1].clamp(min=1.0))
        # fully_shard averaged the gradients over the ranks: scale them back to their sum first
        scale = (dist.get_world_size() if self.sharded else 1) / denominator
        grads = [param.grad for param in self._trainable if param.grad is not None]
        if self._foreach and grads:
            torch._foreach_mul_(grads, scale)
        else:
            for grad in grads:
                grad.mul_(scale)
        out = {key: value / max(float(batch["response_mask"].sum()), 1.0) for key, value in weighted.items()}
        out["actor/loss"] = float(totals[0]) / denominator
        out["actor/num_micro_batches"] = float(len(micro_batches))
        return out

    def _all_reduce_grads(self, totals: torch.Tensor) -> torch.Tensor:
        """Sum ``totals`` and every gradient over the ranks (on the engine's device: NCCL wants
        CUDA tensors); the summed totals, on the host."""
        if not self.distributed:
            return totals
        totals = totals.to(self.device)
        dist.all_reduce(totals)
        if self.sharded:  # fully_shard reduce-scattered the gradients in backward
            return totals.cpu()
        trainable = self._trainable
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in trainable]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for param, grad in zip(trainable, grads, strict=True):
            count = grad.numel()
            param.grad = flat[offset : offset + count].view_as(param).to(param.dtype)
            offset += count
        return totals.cpu()

    def optimizer_step(self) -> dict[str, float]:
        """Clip and step; a NaN/inf grad norm skips the step (the weights stay finite) and is
        reported as ``actor/nonfinite_steps`` = 1, so the worker can stop a run that keeps doing it."""
        grad_norm = full(
            torch.nn.utils.clip_grad_norm_(self._trainable, self.cfg.grad_clip, foreach=self._foreach)
        )
        lr = self.optimizer.param_groups[0]["lr"]
        finite = bool(torch.isfinite(grad_norm))
        if finite:
            step_without_compiler(self.optimizer)
        self.scheduler.step()
        return {"actor/grad_norm": float(grad_norm), "actor/lr": lr, "actor/nonfinite_steps": float(not finite)}

    def train_batch(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        """One optimizer step: zero_grad -> forward/backward -> clip -> step (R-4.1)."""
        self._refuse_routes(batch)
        self.optimizer.zero_grad(set_to_none=True)
        metrics = self._backward(batch, loss_fn)
        metrics.update(self.optimizer_step())
        return metrics

    # -- pi_old (R-2.8) -----------------------------------------------------------------
    def snapshot_pi_old(self) -> None:
        """Pin the current weights as pi_old: a host copy, so the device never holds two."""
        self._pi_old.save(self.model)

    def clear_pi_old(self) -> None:
        self._pi_old.clear()

    # -- export and state ---------------------------------------------------------------
    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named tensors, one at a time (the model *is* an HF model: names map 1:1). Sharded,
        each is gathered whole (a collective: every rank exports together). With LoRA, the
        adapted weights merged (W + (alpha / r) B A) under their base names."""
        if self.lora:
            yield from lora.merged_weights(self.model)
            return
        for name, tensor in self.model.state_dict().items():
            yield name, full(tensor.detach())

    def export_adapters(self) -> Iterator[tuple[str, torch.Tensor]]:
        """With LoRA, what an adapter-only weight sync sends: each adapted layer's A and scaled B
        (``weight_sync.adapters``), nothing of the base model."""
        if not self.lora:
            raise RuntimeError("export_adapters: this engine trains every weight (actor.lora is not set)")
        return lora.adapter_tensors(self.model)

    def state_dict(self) -> dict[str, object]:
        """Sharded, each rank's own shards (its part of the weights and of Adam's moments).
        With LoRA, the adapters alone, and the base model's path and checksum."""
        if self.lora:
            return {
                "adapter": {name: local(param.detach()) for name, param in lora.adapter_parameters(self.model)},
                "base": {"path": str(self.model_path), "sha256": self.base_checksum()},
                "optimizer": local_state(self.optimizer.state_dict()),
                "scheduler": self.scheduler.state_dict(),
            }
        return {
            "model": {name: local(tensor) for name, tensor in self.model.state_dict().items()},
            "optimizer": local_state(self.optimizer.state_dict()),
            "scheduler": self.scheduler.state_dict(),
        }

    def base_checksum(self) -> str:
        """The base model's checksum (computed once: it hashes the weights)."""
        if self._base_checksum is None:
            self._base_checksum = lora.base_checksum(self.model_path)
        return self._base_checksum

    def save_pretrained(self, path: Path) -> None:
        """With LoRA: the adapter alone in the ``adapter/`` folder (a PEFT adapter directory of
        the base model) and, with ``actor.lora.merged_export``, the merged policy as an HF
        directory at ``path`` (else only the tokenizer there: ``load_policy`` takes the folder
        as the base with the adapter merged). Sharded, every rank runs the gathers of
        ``export_weights`` (the other ranks join with it) and the first writes."""
        if self.lora:
            self._save_lora(Path(path))
            return
        whole = None
        if self.sharded:  # the whole model, gathered as every rank's export gathers it; the first rank writes
            whole = dict(self.export_weights())
            if dist.get_rank() != 0:
                return
        save_policy(self.model, self.tokenizer, self.model_path, path, whole)

    def _save_lora(self, path: Path) -> None:
        """The adapter directory, and the merged policy where asked for. Sharded, from one gather
        of the whole policy whether or not it is written (the adapters are read beside the
        weights they merge into, so the save runs the collectives of ``export_weights``, which
        the other ranks join with, and no others)."""
        assert self.cfg.lora is not None
        write_merged = self.cfg.lora.merged_export
        gathered: dict[str, torch.Tensor] | None = {} if self.sharded else None
        weights = dict(lora.merged_weights(self.model, gathered)) if write_merged or self.sharded else {}
        if self.sharded and dist.get_rank() != 0:
            return
        if write_merged:
            merged = lora.merged_model(weights, self.model_path, next(self.model.parameters()).dtype)
            save_policy(merged, self.tokenizer, self.model_path, path)
        else:  # the tokenizer beside the adapter: what reads a policy's text finds it here
            self.tokenizer.save_pretrained(str(path))
        lora.save_adapter(self.model, path / "adapter", gathered)

    def load_state_dict(self, state: dict[str, object]) -> None:
        if self.lora:
            lora.load_adapter_state(self.model, state, self.model_path, self.base_checksum())
            self.optimizer.load_state_dict(state["optimizer"])  # type: ignore[arg-type]
            if self.sharded:
                reshard_optimizer_state(self.optimizer)
        elif not self.sharded:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])  # type: ignore[arg-type]
        else:
            saved: dict[str, torch.Tensor] = state["model"]  # type: ignore[assignment]
            with torch.no_grad():
                for name, tensor in self.model.state_dict().items():
                    local(tensor).copy_(saved[name])
            self.optimizer.load_state_dict(state["optimizer"])  # type: ignore[arg-type]
            reshard_optimizer_state(self.optimizer)
        self.scheduler.load_state_dict(state["scheduler"])  # type: ignore[arg-type]

