"""Engines: the compute that lives inside persistent worker pools (training, rollout, reward)
and the weight-sync backends between them. Heavy GPU backends are imported lazily."""
