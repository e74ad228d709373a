"""The one numerical guard on log-ratios: clamp to +-LOG_RATIO_BOUND right before ``exp``, nowhere else.

Every policy ratio, IS weight and k3 divergence in this package is ``exp`` of a log-ratio. The
clamp exists only to keep that ``exp`` finite, so it sits at the ``exp``: sums, means and
comparisons see the raw log-ratios. Clamping each token before a sum or a mean would change
sequence-level quantities (sequence IS, gspo, geo_mean) as soon as one token passes the bound:
log-ratios [25, -5, -5] have mean 5, but [20, -5, -5] have mean 3.33.
"""

from __future__ import annotations

import torch

LOG_RATIO_BOUND = 20.0
"""exp(20) ~ 4.9e8: far past any clip or threshold in use, yet finite in float32 and bfloat16."""


def bounded_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp(clamp(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)); zero gradient outside the bound."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
