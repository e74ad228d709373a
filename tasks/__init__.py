"""rl-train tasks."""
