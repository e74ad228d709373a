"""LoRA adapters synced alone, served by sglang's own LoRA (``--enable-lora``).

Each adapter-only sync (``weight_sync.adapters``: A and scaled B per adapted layer) becomes a
PEFT adapter folder in the staging root, which the server loads by name
(``/load_lora_adapter``) and every later ``/generate`` names (``lora_path``):

- ``adapter_model.safetensors``: the tensors under PEFT's key names (``base_model.model.`` +
  the sync's names);
- ``adapter_config.json``: ``r`` read from A's shape, ``lora_alpha`` equal to it (B arrives
  already scaled, so sglang's alpha / r is 1), ``target_modules`` the adapted layers' names,
  and the base model's path.

A sync may carry only some tensors (``delta`` hands over the changed ones whole), so the last
adapter is kept here and each folder is the whole adapter. The new version is loaded under a
new name before the old one is unloaded (sglang lets requests that still name the old one
finish first), and the old folder is then removed: only the served adapter stays on disk.
Nothing changes when the server refuses: the kept adapter and the served name stay as they were.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import torch

from rl_train.engines.rollout.sglang.client import RolloutServerError, SglangClient
from rl_train.engines.rollout.sglang.config import SglangLoraConfig
from rl_train.engines.weight_sync.adapters import PARTS, PEFT_PREFIX, WEIGHT, merged, split_adapter_name

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
SUFFIX = "-lora"
"""Ends an adapter folder's name (``v<version>-<id>-lora``), which is also its name on the server."""


class ServedAdapter:
    """The adapter one replica's server serves: the tensors last synced, its folder and its name."""

    def __init__(self, client: SglangClient, staging_root: Path, base_path: Path, settings: SglangLoraConfig | None) -> None:
        self.client, self.staging_root, self.base_path, self.settings = client, staging_root, base_path, settings
        self.held: dict[str, torch.Tensor] = {}
        """A and scaled B of every adapted layer, by their sync names, as last loaded (on the host)."""
        self.name: str | None = None
        """What ``/generate`` names as ``lora_path``; None: the base model is served."""
        self.folder: Path | None = None
        self.staged: tuple[Path, dict[str, torch.Tensor]] | None = None
        """Written while the server was asleep, loaded at wake-up."""

    def folders(self) -> set[Path]:
        return {f for f in (self.folder, self.staged[0] if self.staged else None) if f is not None}

    def write(self, tensors: list[tuple[str, torch.Tensor]], version: int) -> tuple[Path, dict[str, torch.Tensor]]:
        """The kept adapter with ``tensors`` over it, as a PEFT folder (and that whole adapter)."""
        from safetensors.torch import save_file

        adapter = {**self._base_of_next(), **{name: t.detach().to("cpu").clone() for name, t in tensors}}
        rank, targets = self._check(adapter)
        folder = self.staging_root / f"v{version}-{uuid.uuid4().hex[:8]}{SUFFIX}"
        folder.mkdir(parents=True)
        try:
            save_file(
                {PEFT_PREFIX + name: t.contiguous() for name, t in adapter.items()},
                str(folder / WEIGHTS_FILE),
                metadata={"format": "pt"},
            )
            config = {
                "peft_type": "LORA",
                "r": rank,
                "lora_alpha": rank,
                "target_modules": targets,
                "lora_dropout": 0.0,
                "bias": "none",
                "base_model_name_or_path": str(self.base_path),
                "inference_mode": True,
            }
            (folder / CONFIG_FILE).write_text(json.dumps(config, indent=1))
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return folder, adapter

    def _base_of_next(self) -> dict[str, torch.Tensor]:
        """What a partial sync completes: the adapter staged while asleep, else the one served."""
        return dict(self.staged[1]) if self.staged is not None else dict(self.held)

    def _check(self, adapter: dict[str, torch.Tensor]) -> tuple[int, list[str]]:
        """The adapter's rank and target module names; refused (``ValueError``) where a layer
        lacks a part, the ranks differ, or the server could not hold it."""
        layers: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in adapter.items():
            split = split_adapter_name(name)
            assert split is not None, name
            layers.setdefault(split[0], {})[split[1]] = tensor
        ranks: set[int] = set()
        for weight_name, parts in layers.items():
            missing = [part for part in PARTS if part not in parts]
            if missing:
                raise ValueError(
                    f"the adapter of {weight_name!r} arrived without {missing}: the first adapter sync sends both parts of every layer"
                )
            ranks.add(int(parts[PARTS[0]].shape[0]))
        if len(ranks) != 1:
            raise ValueError(f"the adapters have ranks {sorted(ranks)}: one PEFT adapter folder has one rank")
        rank = ranks.pop()
        targets = sorted({weight_name[: -len(WEIGHT)].rsplit(".", 1)[-1] for weight_name in layers})
        self._check_server_holds(rank, targets)
        return rank, targets

    def _check_server_holds(self, rank: int, targets: list[str]) -> None:
        if self.settings is None or self.settings.max_rank is None:
            return
        if rank > self.settings.max_rank:
            raise ValueError(
                f"the adapters have rank {rank}, above rollout.sglang.lora.max_rank {self.settings.max_rank} "
                "(the server's --max-lora-rank): raise it to the adapters' rank (actor.lora.init_from's rank counts)"
            )
        served = self.settings.target_modules
        missing = [name for name in targets if isinstance(served, list) and name not in served]
        if missing:
            raise ValueError(
                f"the adapters adapt {missing}, not in rollout.sglang.lora.target_modules {served!r} "
                "(the server's --lora-target-modules)"
            )

    def load(self, folder: Path, adapter: dict[str, torch.Tensor]) -> None:
        """Serve ``folder`` (written by ``write``): loaded under its own name, then the previous
        adapter unloaded. A refused load removes ``folder`` and changes nothing."""
        name = folder.name
        try:
            self.client.call("/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
        except RolloutServerError as error:
            shutil.rmtree(folder, ignore_errors=True)
            raise RolloutServerError(
                f"{error} (the server must run with --enable-lora, a --max-lora-rank of at least the adapters' "
                "rank and their layers in --lora-target-modules: rollout.sglang.lora)"
            ) from None
        previous, self.name, self.folder, self.held = self.name, name, folder, adapter
        self._unload(previous)

    def drop(self) -> None:
        """Serve the base model again (full weights replaced the adapted layers): the adapter is
        unloaded and forgotten, so a later sync starts a whole new one."""
        previous, self.name, self.folder, self.held, self.staged = self.name, None, None, {}, None
        self._unload(previous)

    def _unload(self, name: str | None) -> None:
        """Unload an adapter no request names any more. A refusal is logged, not raised: what
        is served is already right, and the old adapter only holds server memory."""
        if name is None:
            return
        try:
            self.client.call("/unload_lora_adapter", {"lora_name": name})
        except RolloutServerError as error:
            logger.warning("the LoRA adapter %s stays loaded on the server: %s", name, error)

    def close(self) -> None:
        """Unload the served adapter (a server attached to outlives this replica)."""
        self.drop()

    def merged_into(self, weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The server's base weights with the served adapter merged in (W0 + B A): the weights
        the replica serves, as the built-in engine would hold them after the same sync."""
        layers: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in self.held.items() if self.name is not None else ():
            weight_name, part = split_adapter_name(name)  # type: ignore[misc]  # held holds adapter names only
            layers.setdefault(weight_name, {})[part] = tensor
        for name, tensor in weights:
            parts = layers.get(name)
            yield (name, merged(tensor, parts[PARTS[0]], parts[PARTS[1]])) if parts else (name, tensor)


def is_adapter_sync(items: list[tuple[str, torch.Tensor]]) -> bool:
    """Whether a sync carries adapters (True) or full weights (False); a mix is refused."""
    adapter = [name for name, _ in items if split_adapter_name(name) is not None]
    if adapter and len(adapter) != len(items):
        full = [name for name, _ in items if split_adapter_name(name) is None]
        raise ValueError(
            f"a weight sync carried LoRA adapters ({adapter[:2]}...) and full weights ({full[:2]}...) together: "
            "it sends the adapters alone (actor.lora.sync: adapter) or the merged full weights, never both"
        )
    return bool(adapter)
