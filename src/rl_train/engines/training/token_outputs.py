"""Per-token outputs of a causal LM's logits, as every training engine computes them."""

from __future__ import annotations

import torch


def token_log_probs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(input_ids[t] | input_ids[:t]) at position t, [B, T]; position 0 gets 0."""
    log_probs = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    chosen = log_probs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(chosen, (1, 0))


def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy of the next-token distribution that produced position t, [B, T]."""
    log_probs = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return torch.nn.functional.pad(entropy, (1, 0))


def token_topk_log_probs(logits: torch.Tensor, topk_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(topk_ids[t, j] | input_ids[:t]) at position t, ``[B, T, k]``: the full log-softmax
    of the distribution that produced token t (as ``token_log_probs``), at each of the k ids of
    position t (a teacher's top-k, R-4.10); position 0 gets zeros."""
    log_probs = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    chosen = log_probs.gather(-1, topk_ids[:, 1:].long())
    return torch.nn.functional.pad(chosen, (0, 0, 1, 0))
