"""Agentic rollouts (issue: agent loops and gateway): tools the policy can call, with their limits."""
