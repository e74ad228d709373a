"""Rollout engines: token-in, token-out generation with the chosen tokens' log-probs (R-5.2).

The built-in torch engine runs on CPU; sglang is the GPU engine (imported lazily)."""
