"""Temperature / top-p sampling that also returns the chosen token's log-prob."""

from __future__ import annotations

import torch


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits`` [B, V].

    Returns (tokens [B], log_probs [B]). The log-prob is taken from the full tempered
    distribution log_softmax(logits / T), the same quantity the training engine computes,
    so rollout and training log-probs agree; top-p only restricts which tokens may be drawn.
    Temperature 0 means greedy.
    """
    if temperature <= 0:
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        tokens = log_probs.argmax(dim=-1)
        return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)
    tempered = logits.float() if temperature == 1.0 else logits.float() / temperature  # x / 1.0 is x
    log_probs = torch.log_softmax(tempered, dim=-1)
    probs = log_probs.exp()
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)
