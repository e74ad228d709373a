"""``rollout.sglang.*``: where the sglang server is and how the backend talks to it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rl_train.algorithms.config import StrictModel


class SglangConfig(StrictModel):
    url: str | None = None
    """A running sglang server to attach to (http://host:port); None: each replica launches its own."""
    launch_args: list[str] = Field(default_factory=list)
    """Extra arguments of ``python -m sglang.launch_server`` when a replica launches its server."""
    startup_timeout_s: float = Field(600.0, gt=0)
    """Longest wait for a launched server to answer /health."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """Longest wait to connect to the server, per request."""
    request_timeout_s: float = Field(600.0, gt=0)
    """Longest wait for any one response (a whole batch's generation included)."""
    weight_update: Literal["disk", "distributed"] = "disk"
    """How synced weights reach the server: safetensors in staging_dir and /update_weights_from_disk, or a broadcast over a torch.distributed group the server joins (/update_weights_from_distributed; NCCL on GPU, gloo on CPU)."""
    staging_dir: str | None = None
    """Folder the server can read, for weight_update=disk (None: a temporary folder on this host)."""
    group_address: str | None = None
    """This host's address as the server sees it, for weight_update=distributed (None: the URL's host when attaching, else 127.0.0.1)."""
