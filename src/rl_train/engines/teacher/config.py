"""The ``teacher:`` config section: the model that scores trajectories for distillation."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from rl_train.algorithms.config import StrictModel

MAX_TOP_K = 256
"""The most next-token candidates a teacher writes per response token (each costs two numbers
per token in the queue and in checkpoints)."""
TEACHER_SCORED_VERSIONS = "teacher_scored_versions"
"""The record field holding its ``token_versions`` when the teacher scored it (``scoring``); here,
where the teacher worker's module reads it without importing torch (the driver imports it)."""


class TeacherConfig(StrictModel):
    """A teacher: read by the distillation losses (``actor.policy_loss`` reverse_kl,
    forward_kl_topk, distillation_ppo); a run whose loss reads none has no teacher pool."""

    path: str | None = None
    """HF-format causal LM directory of the teacher (a run's saved policy/ works, e.g. runs/arith-tiny/policy); None: no teacher. Its tokenizer must be the student's (model.path): a mismatch is refused at start."""
    top_k: int = Field(0, ge=0, le=MAX_TOP_K)
    """Next-token candidates written per response token (the teacher's top-k ids and log-probs), read by forward_kl_topk; 0: the sampled token's log-prob only."""
    temperature: float = Field(1.0, gt=0.0)
    """The teacher's softmax temperature for its log-probs."""
    num_workers: int = Field(1, ge=1)
    """Teacher worker actors; each prompt group goes whole to one (as in the reward pool)."""
    streaming: bool = False
    """Score each prompt group as soon as rollout finishes it, in the background on its teacher worker (as reward.streaming does for rewards), so that the teacher phase finds it scored; the phase scores whatever is still missing (a late group, one lost with a worker that died). On by default in the async modes."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the teacher workers run: cuda gives each a GPU (a whole one in its own pool, a share of a rollout replica's when colocated)."""
    placement: Literal["own_pool", "colocate"] = "own_pool"
    """own_pool: the teacher workers have devices of their own; colocate (on cuda): each shares a rollout replica's GPU, and its model is loaded for each scoring and dropped after, as a colocated reward model is (R-6.8). separate_async requires own_pool (R-2.6)."""
    micro_batch_size: int = Field(64, ge=1)
    """Trajectories per forward pass of the teacher."""
    num_threads: int = Field(1, ge=1)
    """torch threads of each teacher worker (on the CPU)."""
    impl: Literal["auto", "native", "transformers"] = "auto"
    """The teacher's model code, as model.impl for the policy."""

    @property
    def on(self) -> bool:
        return self.path is not None


def check_teacher_path(teacher: TeacherConfig) -> None:
    """Before a run starts, and in each teacher worker: the teacher's directory exists and holds
    an HF model whose weights are safetensors (never a pickled ``.bin``: a teacher is a file from
    outside the run); its tokenizer is checked against the student's when the workers start."""
    if teacher.path is None:
        return
    folder = Path(teacher.path)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"teacher.path {teacher.path} does not exist: train the teacher first (the demo, `bash scripts/demo.sh`, "
            "saves its policy as runs/arith-tiny/policy) or point teacher.path at an HF causal LM directory"
        )
    adapter = folder / "adapter"
    if not (folder / "config.json").is_file() and not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"teacher.path {teacher.path} holds no config.json (nor a LoRA adapter/): it is not an HF model directory"
        )
    if not any(folder.glob("*.safetensors")) and not (adapter / "adapter_model.safetensors").is_file():
        raise FileNotFoundError(
            f"teacher.path {teacher.path} holds no *.safetensors weights; a teacher loads from safetensors only "
            "(never a pickled .bin): save it with save_pretrained(..., safe_serialization=True)"
        )
