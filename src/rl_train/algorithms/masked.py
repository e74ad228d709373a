"""Masked reductions over ``[B, T]`` tensors: statistics count only tokens where the mask is 1."""

from __future__ import annotations

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1 (over ``dim``, or everything)."""
    masked = values * mask.to(values.dtype)
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over the masked entries; an empty mask gives 0 (denominator clamped to 1)."""
    count = mask.to(values.dtype).sum() if dim is None else mask.to(values.dtype).sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased (Bessel-corrected) variance over the masked entries; 0 with fewer than two."""
    count = mask.to(values.dtype).sum()
    centred = (values - masked_mean(values, mask)) * mask.to(values.dtype)
    return centred.square().sum() / (count - 1).clamp(min=1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, epsilon: float = 1e-8) -> torch.Tensor:
    """(values - mean) / sqrt(var + eps) with mean/var over the masked entries; zero outside the mask."""
    whitened = (values - masked_mean(values, mask)) * torch.rsqrt(masked_var(values, mask) + epsilon)
    return whitened * mask.to(values.dtype)
