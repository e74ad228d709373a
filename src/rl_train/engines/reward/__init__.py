"""Reward: scoring functions routed by each sample's data_source (R-6.1)."""
