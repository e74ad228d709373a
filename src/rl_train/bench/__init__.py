"""rl-train bench."""
