"""Training engines: the plain-torch engine (CPU/GPU, DP over torch.distributed) and the
megatron-core engine for TP/PP at scale (imported lazily)."""
