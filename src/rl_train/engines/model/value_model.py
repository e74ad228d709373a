"""The critic's model: the policy's transformer (its weights) with a scalar value head.

The backbone is loaded with ``AutoModel`` from the policy's own HF directory, so the critic
starts from what the policy knows (the usual PPO init) and any causal LM the policy can be
also gives a critic. The head is a fresh ``Linear(hidden, 1)`` initialised to zero: every
value starts at 0, the expected return of a policy that starts near zero reward, so the first
advantages are the raw rewards rather than noise from a random head.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rl_train.engines.model.tokenizer import load_tokenizer


class ValueModel(torch.nn.Module):
    def __init__(self, backbone: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """[B, T] value of each prefix: position t scores the sequence up to and including token t."""
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state
        return self.value_head(hidden).squeeze(-1).float()


def load_value_model(path: str | Path, dtype: torch.dtype = torch.float32) -> tuple[ValueModel, object]:
    """The critic for the policy at ``path`` (a local HF directory, read offline) and its tokenizer."""
    from transformers import AutoModel

    backbone = AutoModel.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    model = ValueModel(backbone, int(backbone.config.hidden_size)).to(dtype)
    return model, load_tokenizer(path)
