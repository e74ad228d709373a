"""rl-train deployments."""
