"""``rollout.sglang.*``: where the sglang server is and how the backend talks to it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rl_train.algorithms.config import StrictModel

SGLANG_LORA_MODULES = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    "qkv_proj", "gate_up_proj", "embed_tokens", "lm_head",
)  # fmt: skip
"""The layers sglang 0.5's LoRA adapts (``--lora-target-modules`` takes these, or ``all``)."""
ALL = "all"


class SglangLoraConfig(StrictModel):
    """sglang's LoRA, for adapters synced alone (``actor.lora``): the server must be launched
    able to hold them, since it sizes their memory at start."""

    max_rank: int | None = Field(None, ge=1)
    """The largest adapter rank the server holds (--max-lora-rank); None: actor.lora.rank."""
    target_modules: list[str] | Literal["all"] | None = None
    """The layers the server adapts (--lora-target-modules): names sglang adapts (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, qkv_proj, gate_up_proj, embed_tokens, lm_head) or all; None: actor.lora.target_modules (all for all-linear)."""

    @field_validator("target_modules")
    @classmethod
    def _known(cls, value: list[str] | str | None) -> list[str] | str | None:
        if isinstance(value, list):
            unknown = [name for name in value if name not in SGLANG_LORA_MODULES]
            if unknown or not value:
                raise ValueError(
                    f"got {value!r}: sglang adapts {', '.join(SGLANG_LORA_MODULES)} (or give 'all')"
                )
        return value

    def launch_args(self) -> list[str]:
        """The server's LoRA arguments (a resolved config: both fields set)."""
        assert self.max_rank is not None and self.target_modules is not None, "resolve_lora fills both"
        targets = [ALL] if self.target_modules == ALL else list(self.target_modules)
        return ["--enable-lora", "--max-lora-rank", str(self.max_rank), "--lora-target-modules", *targets]


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
    """How synced weights reach the server: safetensors in staging_dir and /update_weights_from_disk, or a broadcast over a torch.distributed group the server joins (/update_weights_from_distributed; NCCL on GPU, gloo on CPU). LoRA adapters synced alone always go through staging_dir (/load_lora_adapter)."""
    staging_dir: str | None = None
    """Folder the server can read, for weight_update=disk and for LoRA adapters (None: a temporary folder on this host)."""
    group_address: str | None = None
    """This host's address as the server sees it, for weight_update=distributed (None: the URL's host when attaching, else 127.0.0.1)."""
    lora: SglangLoraConfig | None = None
    """The server's LoRA, for adapters synced alone: {max_rank: --max-lora-rank, default actor.lora.rank; target_modules: --lora-target-modules, default actor.lora.target_modules, all for all-linear}, filled from actor.lora when it sends adapters (actor.lora.sync: adapter). A launched server starts with --enable-lora and these; a server attached to by url must have been launched so. None: no LoRA."""


def _stacking_problem(targets: list[str]) -> str | None:
    """What sglang cannot load of adapters on ``targets``: it stacks q, k and v into one
    adapter (needing q and v, k optional) and gate and up into another (needing gate)."""
    attention = {"q_proj", "k_proj", "v_proj"} & set(targets)
    if attention and not {"q_proj", "v_proj"} <= attention:
        return f"{sorted(attention)} without {sorted({'q_proj', 'v_proj'} - attention)}: sglang stacks q_proj, k_proj and v_proj into one adapter and needs q_proj and v_proj both"
    if "up_proj" in targets and "gate_proj" not in targets:
        return "up_proj without gate_proj: sglang stacks gate_proj and up_proj into one adapter and needs gate_proj"
    return None


def resolve_lora(lora: SglangLoraConfig | None, rank: int, targets: list[str] | str) -> SglangLoraConfig:
    """``rollout.sglang.lora`` for a run that syncs adapters of ``rank`` on ``targets``
    (``actor.lora.rank``, ``actor.lora.target_modules``): its unset fields filled from them,
    refused (``ValueError`` naming both sides) where the server could not load the adapters."""
    lora = lora or SglangLoraConfig()
    fix = "or set actor.lora.sync: merged to send the merged weights instead"
    if isinstance(targets, list):
        unknown = [name for name in targets if name not in SGLANG_LORA_MODULES]
        if unknown:
            raise ValueError(
                f"actor.lora.target_modules: {unknown} are layers sglang's LoRA does not adapt "
                f"(rollout.engine sglang adapts {', '.join(SGLANG_LORA_MODULES)}); {fix}"
            )
        problem = _stacking_problem(targets)
        if problem is not None:
            raise ValueError(f"actor.lora.target_modules: {problem}; {fix}")
    max_rank = lora.max_rank if lora.max_rank is not None else rank
    if rank > max_rank:
        raise ValueError(
            f"actor.lora.rank: got {rank}, above rollout.sglang.lora.max_rank {max_rank} (the server's "
            "--max-lora-rank); raise rollout.sglang.lora.max_rank or lower actor.lora.rank"
        )
    served = lora.target_modules if lora.target_modules is not None else (list(targets) if isinstance(targets, list) else ALL)
    if served != ALL:
        if not isinstance(targets, list):
            raise ValueError(
                f"actor.lora.target_modules {targets!r} adapts every linear layer, and rollout.sglang.lora.target_modules "
                f"is {served!r}: set it to all (or leave it unset), or list actor.lora.target_modules"
            )
        missing = [name for name in targets if name not in served]
        if missing:
            raise ValueError(
                f"actor.lora.target_modules: {missing} are not in rollout.sglang.lora.target_modules {served!r} "
                "(the server's --lora-target-modules); add them there"
            )
    return SglangLoraConfig(max_rank=max_rank, target_modules=served)
