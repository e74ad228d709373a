"""Flows: the trainer modes (a registry of lifecycle-hook classes), the global-step flow whose
tasks are the RL phases, and the top-level ``rl-train`` flow."""
