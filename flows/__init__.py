"""rl-train flows."""
