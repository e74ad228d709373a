"""Temperature / top-p sampling that also returns the chosen token's log-prob."""

from __future__ import annotations

import torch

from rl_train.engines.model.scripted import scripted


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits`` [B, V] (``sample``, compiled by TorchScript where
    it can be: a decode step calls it once, and its ten kernels' Python calls add up)."""
    run = scripted(sample)
    return (run or sample)(logits, temperature, top_p, generator)


def sample(
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
    tokens = draw(probs, generator)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of ``probs`` [B, V] (non-negative, rows need not sum to 1), by inverting
    each row's cumulative sum at one uniform draw: B random numbers where ``torch.multinomial``
    draws B x V of them (a third of a decode step's sampling time on the CPU, measured). A
    zero-probability index is never drawn: the search returns the first index whose cumulative
    sum exceeds the draw, and the draw is below the row's total."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    u = torch.rand(total.shape, generator=generator, device=probs.device, dtype=cdf.dtype) * total
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
