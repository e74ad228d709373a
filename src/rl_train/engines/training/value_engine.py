"""The plain-torch value engine: the critic of one DP rank (R-4.1-4.3 for a value model).

It implements ``ValueEngine`` (``critic_protocol``) as the torch training engine implements
``TrainingEngine``: forward-only passes in eval mode without grad,
micro-batches cut by ``split_micro_batches``, and an update that backpropagates loss
*numerators*, sums gradients and denominators over DP ranks (gloo all-reduce) and divides
once by the global denominator, so it does not depend on how the batch is cut.

Values are aligned with the log-probs: position t holds V(s_t), the value of the state in
which token t is generated (the prefix up to t - 1), read from the head at position t - 1.
Position 0 has no state before it and gets 0, like ``token_log_probs``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist

from rl_train.engines.model.value_model import load_value_model
from rl_train.engines.training.critic_config import CriticConfig
from rl_train.engines.training.lazy_dynamo import optimizers_without_compiler, step_without_compiler
from rl_train.engines.training.micro_batch import split_micro_batches
from rl_train.engines.training.protocol import Batch, LossFn

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def warmup_factor(warmup_steps: int) -> Callable[[int], float]:
    """Linear warm-up over ``warmup_steps`` optimizer steps, then the constant peak lr."""

    def factor(step: int) -> float:
        return (step + 1) / warmup_steps if step < warmup_steps else 1.0

    return factor


class TorchValueEngine:
    def __init__(self, model_path: str | Path, cfg: CriticConfig, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model, tokenizer = load_value_model(model_path)
        self.tokenizer = cast("PreTrainedTokenizerBase", tokenizer)
        self.cfg = cfg
        optimizers_without_compiler()
        self.optimizer = torch.optim.AdamW(  # fused: see TorchTrainingEngine
            self.model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=True
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, warmup_factor(cfg.lr_warmup_steps))
        self.distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def _forward(self, micro_batch: Batch) -> Batch:
        mask = micro_batch["attention_mask"]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        prefix_values = self.model(micro_batch["input_ids"], mask, positions)
        return {"values": torch.nn.functional.pad(prefix_values[:, :-1], (1, 0))}

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """Forward only, eval mode: V(s_t) per position, ``[B, T]`` like ``batch["input_ids"]``."""
        self.model.eval()
        width = batch["input_ids"].shape[1]
        parts = []
        for micro in split_micro_batches(
            batch, self.cfg.infer_micro_batch_size, self.cfg.max_tokens_per_micro_batch
        ):
            values = self._forward(micro)["values"]  # trimmed to the micro-batch's longest row
            parts.append(torch.nn.functional.pad(values, (0, width - values.shape[1])))
        return torch.cat(parts)

    def train_batch(self, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
        """One critic optimizer step: zero_grad -> forward/backward -> all-reduce -> clip -> step."""
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        micro_batches = split_micro_batches(
            batch, self.cfg.micro_batch_size, self.cfg.max_tokens_per_micro_batch
        )
        totals = torch.zeros(2, dtype=torch.float64)
        weighted: dict[str, float] = {}
        for micro in micro_batches:
            numerator, denominator, metrics = loss_fn(self._forward(micro), micro)
            numerator.backward()
            totals += torch.tensor([float(numerator.detach()), float(denominator)], dtype=torch.float64)
            tokens = float(micro["response_mask"].sum())
            for key, value in metrics.items():
                weighted[key] = weighted.get(key, 0.0) + value * tokens
        self._all_reduce_grads(totals)
        denominator = float(totals[1].clamp(min=1.0))
        for param in self.model.parameters():
            if param.grad is not None:
                param.grad.div_(denominator)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        lr = self.optimizer.param_groups[0]["lr"]
        if torch.isfinite(grad_norm):
            step_without_compiler(self.optimizer)
        self.scheduler.step()
        tokens = max(float(batch["response_mask"].sum()), 1.0)
        out = {key: value / tokens for key, value in weighted.items()}
        out.update({"critic/vf_loss": float(totals[0]) / denominator, "critic/grad_norm": float(grad_norm)})
        out["critic/lr"] = lr
        return out

    def _all_reduce_grads(self, totals: torch.Tensor) -> None:
        """Sum loss totals and gradients over the critic's DP ranks (one flat all-reduce)."""
        if not self.distributed:
            return
        dist.all_reduce(totals)
        params = list(self.model.parameters())
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for param, grad in zip(params, grads, strict=True):
            param.grad = flat[offset : offset + grad.numel()].view_as(param).to(param.dtype)
            offset += grad.numel()

    def state_dict(self) -> dict[str, object]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.model.load_state_dict(state["model"])  # type: ignore[arg-type]
        self.optimizer.load_state_dict(state["optimizer"])  # type: ignore[arg-type]
        self.scheduler.load_state_dict(state["scheduler"])  # type: ignore[arg-type]
