"""sglang's own request and response types of its native HTTP API, to hold the test server to.

Checked against sglang 0.5.9 (``SGLANG_VERSION``; ``pyproject.toml`` extra ``sglang-schemas``,
installed by ``scripts/test.sh`` with ``--no-deps``). 0.5.9 is a pure-Python wheel, so it installs
on every Python the project supports (several later 0.5 releases are CPython-3.11-only builds).

The types are the dataclasses sglang's HTTP server takes each body as
(``sglang/srt/managers/io_struct.py``: ``GenerateReqInput``, ``UpdateWeightFromDiskReqInput``,
...) and builds each weight endpoint's answer from (``...ReqOutput``). That module imports five
names from sglang's serving runtime, whose modules import triton, torchvision and the CUDA
kernels; none of the five is used by the types checked here (they annotate the multimodal
fields and the scheduler's outputs), but for ``LoRARef``, which types the adapters a LoRA
endpoint's answer lists: those entries are taken as they are. So ``io_struct.py`` and ``sampling_params.py`` (which
imports only the standard library) are run from the installed package as they are, with
stand-ins for those five names, the stand-ins removed from ``sys.modules`` afterwards. The
stand-in for ``has_valid_data`` refuses any multimodal data (the backend never sends it).

A body is checked as sglang takes it, and a little stricter: its keys must be fields of the
type (sglang's server ignores an unknown key, so a misspelt or removed field would pass there
unnoticed), pydantic validates it against the dataclass (what FastAPI does for sglang's routes),
and a ``/generate`` body is normalised (``normalize_batch_and_arguments``) and each of its
sampling-parameter dicts built into sglang's ``SamplingParams`` and verified against the
model's vocabulary, as sglang's tokenizer manager does before it schedules a request.
``/generate``'s answer has no sglang type (the tokenizer manager assembles it as a dict), so
only the weight endpoints' and ``/get_load``'s answers are checked.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import sys
import types
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import core_schema

SGLANG_VERSION = "0.5.9"
"""The sglang release whose types the test server is checked against."""

_STAND_INS = {
    "sglang.srt.lora.lora_registry": ("LoRARef",),
    "sglang.srt.managers.schedule_batch": ("BaseFinishReason",),
    "sglang.srt.multimodal.mm_utils": ("has_valid_data",),
    "sglang.srt.utils": ("ImageData",),
}
"""The runtime modules io_struct imports names from, and those names (sampling_params is real)."""


class SchemaError(ValueError):
    """A body that does not fit sglang's type for its endpoint."""


def _refuse_multimodal(data: Any) -> bool:
    if data is None or data == []:
        return False
    raise SchemaError("multimodal data in a request: the backend never sends any, and this check cannot judge it")


class _StandIn:
    """A type that annotates only fields no checked body carries: pydantic lets it be anything."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.any_schema()


def _stand_in(name: str, names: tuple[str, ...]) -> types.ModuleType:
    module = types.ModuleType(name)
    for attribute in names:
        value = _refuse_multimodal if attribute == "has_valid_data" else type(attribute, (_StandIn,), {})
        setattr(module, attribute, value)
    return module


def _run_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic resolves the dataclasses' annotations in it
    spec.loader.exec_module(module)
    return module


@cache
def io_struct() -> types.ModuleType:
    """sglang's ``io_struct`` module, run from the installed package (see the module docstring)."""
    try:
        installed = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            f"sglang is not installed: pip install --no-deps 'sglang=={SGLANG_VERSION}' (scripts/test.sh does)"
        ) from None
    if installed != SGLANG_VERSION:
        raise RuntimeError(f"sglang {installed} is installed; the test server is checked against {SGLANG_VERSION}")
    root = Path(str(importlib.metadata.distribution("sglang").locate_file("sglang")))
    _run_file("sglang.srt.sampling.sampling_params", root / "srt" / "sampling" / "sampling_params.py")
    saved = {name: sys.modules.get(name) for name in _STAND_INS}
    sys.modules.update({name: _stand_in(name, names) for name, names in _STAND_INS.items()})
    try:
        return _run_file("sglang.srt.managers.io_struct", root / "srt" / "managers" / "io_struct.py")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


@dataclass(frozen=True)
class Endpoint:
    request: str | None
    """The io_struct type sglang takes the body as; None: the endpoint takes no body."""
    response: str | None
    """The io_struct type its answer is built from; None: sglang has no type for the answer."""
    many: bool = False
    """The answer is a list of ``response`` (one per data-parallel rank)."""


ENDPOINTS = {
    "/generate": Endpoint("GenerateReqInput", None),
    "/abort_request": Endpoint("AbortReq", None),
    "/flush_cache": Endpoint(None, None),
    "/get_load": Endpoint(None, "GetLoadReqOutput", many=True),
    "/get_server_info": Endpoint(None, None),
    "/health": Endpoint(None, None),
    "/release_memory_occupation": Endpoint("ReleaseMemoryOccupationReqInput", None),
    "/resume_memory_occupation": Endpoint("ResumeMemoryOccupationReqInput", None),
    "/update_weights_from_disk": Endpoint("UpdateWeightFromDiskReqInput", "UpdateWeightFromDiskReqOutput"),
    "/init_weights_update_group": Endpoint("InitWeightsUpdateGroupReqInput", "InitWeightsUpdateGroupReqOutput"),
    "/update_weights_from_distributed": Endpoint(
        "UpdateWeightsFromDistributedReqInput", "UpdateWeightsFromDistributedReqOutput"
    ),
    "/destroy_weights_update_group": Endpoint(
        "DestroyWeightsUpdateGroupReqInput", "DestroyWeightsUpdateGroupReqOutput"
    ),
    "/get_weights_by_name": Endpoint("GetWeightsByNameReqInput", "GetWeightsByNameReqOutput"),
    "/load_lora_adapter": Endpoint("LoadLoRAAdapterReqInput", "LoadLoRAAdapterReqOutput"),
    "/unload_lora_adapter": Endpoint("UnloadLoRAAdapterReqInput", "UnloadLoRAAdapterReqOutput"),
}
"""Every sglang endpoint the backend calls, with its types in sglang 0.5.9's HTTP server
(``sglang/srt/entrypoints/http_server.py``)."""


@cache
def _adapter(type_name: str) -> TypeAdapter[Any]:
    return TypeAdapter(getattr(io_struct(), type_name))


def _fit(type_name: str, body: Any, what: str) -> Any:
    """``body`` as sglang's ``type_name``: its keys fields of the type, then pydantic's validation."""
    cls = getattr(io_struct(), type_name)
    if not isinstance(body, dict):
        raise SchemaError(f"{what} is {type(body).__name__}, not the object sglang {SGLANG_VERSION} takes as {type_name}")
    unknown = sorted(set(body) - {field.name for field in dataclasses.fields(cls)})
    if unknown:
        raise SchemaError(f"{what} has keys that sglang {SGLANG_VERSION}'s {type_name} does not have: {unknown}")
    try:
        return _adapter(type_name).validate_python(body)
    except ValidationError as error:
        raise SchemaError(f"{what} does not fit sglang {SGLANG_VERSION}'s {type_name}: {error}") from None


def check_request(endpoint: str, body: Any, vocab_size: int) -> None:
    """Raise ``SchemaError`` unless sglang would take ``body`` (decoded JSON, None: no body)."""
    if endpoint not in ENDPOINTS:
        raise SchemaError(f"{endpoint} is not an sglang endpoint the backend is checked against")
    spec = ENDPOINTS[endpoint]
    if spec.request is None:
        if body not in (None, {}):
            raise SchemaError(f"{endpoint} takes no body in sglang {SGLANG_VERSION}, got {str(body)[:200]}")
        return
    request = _fit(spec.request, {} if body is None else body, f"the {endpoint} request")
    if spec.request == "GenerateReqInput":
        _check_generate(request, vocab_size)


def _check_generate(request: Any, vocab_size: int) -> None:
    """What sglang's tokenizer manager does with a generate request before scheduling it."""
    sampling_params_cls = sys.modules["sglang.srt.sampling.sampling_params"].SamplingParams
    try:
        request.normalize_batch_and_arguments()
        batch = request.sampling_params if isinstance(request.sampling_params, list) else [request.sampling_params]
        for params in batch:
            sampling_params_cls(**(params or {})).verify(vocab_size)
    except (TypeError, ValueError) as error:
        raise SchemaError(f"sglang {SGLANG_VERSION} refuses the /generate request: {error}") from None


def check_response(endpoint: str, body: Any) -> None:
    """Raise ``SchemaError`` unless ``body`` is what sglang answers ``endpoint`` with (where it
    has a type for it)."""
    spec = ENDPOINTS[endpoint]
    if spec.response is None:
        return
    what = f"the {endpoint} answer"
    if spec.many:
        if not isinstance(body, list):
            raise SchemaError(f"{what} is {type(body).__name__}, not a list of {spec.response}")
        for item in body:
            _fit(spec.response, item, what)
    elif spec.response == "GetWeightsByNameReqOutput":  # the server answers with the output's parameter
        _fit(spec.response, {"parameter": body}, what)
    else:
        _fit(spec.response, body, what)
