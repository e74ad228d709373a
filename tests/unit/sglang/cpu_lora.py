"""sglang's LoRA serving in the CPU test server (``cpu_server.py``): ``/load_lora_adapter``,
``/unload_lora_adapter`` and ``lora_path`` on ``/generate``, in sglang 0.5.9's shapes.

An adapter folder is read as sglang reads one: ``adapter_config.json`` (``peft_type`` LORA,
``r``, ``lora_alpha``, ``target_modules``) and the safetensors under PEFT's key names
(``base_model.model.<module>.lora_A.weight`` / ``lora_B``), each layer's update scaled by
``lora_alpha / r``. A name already loaded is refused; a request naming an adapter never loaded
is refused; one naming an adapter unloaded since is loaded again from its folder (sglang keeps
each name's path for that). The built-in engine behind the server serves an adapter merged
into its weights, switched per batch of requests that name the same adapter (the layers
another adapter left merged get a zero update, so they serve their base weights bit for bit).
A batch holds its adapter merged until it ends (``serving``): a batch naming another adapter,
or a read of the base weights, waits for it, so no batch is decoded partly under another's
adapter (sglang serves adapters side by side; the test server takes them in turn).
Full weights loaded replace the base and leave the adapters loaded, applied over the new base,
as sglang does; ``/get_weights_by_name`` answers the base weights, without any adapter.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from safetensors.torch import load_file

from rl_train.engines.rollout.torch_engine import TorchRolloutEngine

PEFT_KEY_PREFIX = "base_model.model."
"""What PEFT puts before a module's name in an adapter file (fixed by PEFT's format)."""


class LoraServing:
    def __init__(self, engine: TorchRolloutEngine, lock: threading.Lock) -> None:
        self.engine, self.lock = engine, lock
        self.loaded: dict[str, dict[str, torch.Tensor]] = {}
        """Each loaded adapter: A and scaled B by the names the built-in engine merges."""
        self.paths: dict[str, str] = {}
        """Every name ever loaded, and its folder (sglang's ``lora_ref_cache``)."""
        self.applied: str | None = None
        """The adapter merged into the engine now (None: the base)."""
        self.requests: dict[str, int] = {}
        """Generate requests per ``lora_path`` named (``"base"`` for none)."""
        self.turn = threading.RLock()
        """Held from merging an adapter until the work that needed it merged ends."""

    def state(self) -> dict[str, Any]:
        return {"loaded": sorted(self.loaded), "applied": self.applied, "requests": dict(self.requests)}

    def read(self, folder: str) -> dict[str, torch.Tensor]:
        """The folder's adapter as the engine merges it, or ``ValueError`` as sglang would refuse it."""
        config = json.loads((Path(folder) / "adapter_config.json").read_text())
        if str(config.get("peft_type", "")).lower() != "lora":
            raise ValueError(f"peft_type {config.get('peft_type')!r} is not LORA")
        rank, scale = int(config["r"]), float(config["lora_alpha"]) / int(config["r"])
        targets = set(config["target_modules"])
        tensors: dict[str, torch.Tensor] = {}
        for file in sorted(Path(folder).glob("*.safetensors")):
            tensors.update(load_file(str(file)))
        adapter = {}
        for key, tensor in tensors.items():
            if not key.startswith(PEFT_KEY_PREFIX) or not key.endswith((".lora_A.weight", ".lora_B.weight")):
                raise ValueError(f"{key!r} is not a PEFT LoRA key")
            name = key.removeprefix(PEFT_KEY_PREFIX)
            module = name.rsplit(".", 3)[1]  # <path>.<module>.lora_A.weight
            if module not in targets:
                raise ValueError(f"{key!r} adapts {module!r}, not in target_modules {sorted(targets)}")
            is_a = name.endswith(".lora_A.weight")
            if tensor.shape[0 if is_a else 1] != rank:
                raise ValueError(f"{key!r} has shape {list(tensor.shape)}, not of rank {rank}")
            adapter[name] = tensor if is_a else tensor * scale
        if not adapter:
            raise ValueError(f"no adapter tensors in {folder}")
        return adapter

    @contextmanager
    def serving(self, name: str | None) -> Iterator[None]:
        """Adapter ``name`` (None: the base) merged for as long as the block runs."""
        with self.turn:
            self.apply(name)
            yield

    def apply(self, name: str | None) -> None:
        """Merge adapter ``name`` (None: none) into the engine, under the weights lock, in its
        turn (while no batch is served under another adapter)."""
        with self.turn, self.lock:
            if name == self.applied:
                return
            tensors = dict(self.loaded[name]) if name is not None else {}
            for weight_name in self.engine.adapters.adapted():  # what another adapter left merged
                module = weight_name.removesuffix(".weight")
                if f"{module}.lora_A.weight" not in tensors:
                    out, inp = self.engine.model.get_submodule(module).weight.shape
                    tensors[f"{module}.lora_A.weight"] = torch.zeros(1, inp)
                    tensors[f"{module}.lora_B.weight"] = torch.zeros(out, 1)
            if tensors:
                self.engine.update_weights(tensors.items(), version=self.engine.version)
            self.applied = name

    def resolve(self, names: list[str | None]) -> None:
        """sglang's check of a request's adapters: known, and loaded again if unloaded since."""
        for name in {n for n in names if n is not None}:
            self.requests[name] = self.requests.get(name, 0) + 1
            if name in self.loaded:
                continue
            if name not in self.paths:
                raise ValueError(f"Got LoRA adapter that has never been loaded: {name}")
            self.loaded[name] = self.read(self.paths[name])
        if None in names:
            self.requests["base"] = self.requests.get("base", 0) + 1

    def base_replaced(self) -> None:
        """Full weights were loaded: the engine's layers forgot their merged adapter."""
        self.applied = None


def _answer(success: bool, message: str | None, loaded: dict[str, str]) -> dict[str, Any]:
    """sglang's ``LoRAUpdateOutput``, with each loaded adapter's ``LoRARef``."""
    refs = {n: {"lora_id": f"id-{n}", "lora_name": n, "lora_path": p, "pinned": False} for n, p in loaded.items()}
    return {"success": success, "error_message": message, "loaded_adapters": refs}


def add_lora_endpoints(
    app: FastAPI, lora: LoraServing, call: Callable[..., Any], fault: Callable[[str], Awaitable[Response | None]]
) -> None:
    """``call(fn, *args)``: runs ``fn`` off the event loop; ``fault(endpoint)``: the test fault's
    answer for this call, if it has one (``POST /test/fault``)."""

    def loaded_paths() -> dict[str, str]:
        return {n: lora.paths[n] for n in lora.loaded}

    @app.post("/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Any:
        if (response := await fault("/load_lora_adapter")) is not None:
            return response
        body = await request.json()
        name = body["lora_name"]
        if name in lora.loaded:
            message = f"Failed to load LoRA adapter {name} because it is already loaded"
            return JSONResponse(_answer(False, message, loaded_paths()), 400)
        try:
            adapter = await call(lora.read, body["lora_path"])
        except (OSError, ValueError, KeyError) as error:
            return JSONResponse(_answer(False, f"{type(error).__name__}: {error}", loaded_paths()), 400)
        lora.loaded[name], lora.paths[name] = adapter, body["lora_path"]
        return _answer(True, None, loaded_paths())

    @app.post("/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Any:
        if (response := await fault("/unload_lora_adapter")) is not None:
            return response
        name = (await request.json())["lora_name"]
        if name not in lora.loaded:
            return JSONResponse(_answer(False, f"LoRA adapter {name} is not loaded", loaded_paths()), 400)
        del lora.loaded[name]
        if lora.applied == name:
            await call(lora.apply, None)
        return _answer(True, None, loaded_paths())
