"""rl-train storage."""
