"""rl-train: agentic RL post-training of LLMs as Prefect flows over persistent Ray worker pools."""

__version__ = "0.1.0"
