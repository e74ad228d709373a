"""A nested state (an optimizer's ``state_dict``, RNG states) as tensors plus a JSON skeleton.

Pickle would round-trip anything, but a checkpoint must outlive the code that wrote it and be
safe to open; so tensors go to a safetensors file and everything else to strict JSON, with
tags where JSON alone would lose a type that a consumer checks:

- ``{"__tuple__": [...]}``: ``random.setstate`` and numpy's ``set_state`` refuse lists;
- ``{"__dict__": [[key, value], ...]}``: a dict with a non-str key (an optimizer's ``state``
  is keyed by parameter index, and an int key must come back an int) or a ``__``-prefixed one;
- ``{"__tensor__": name}``, ``{"__ndarray__": name, "dtype": "<u4", "shape": [...]}``: the
  array's bytes are in the tensor file (a numpy array as uint8, its dtype kept here);
- ``{"__float__": "nan" | "inf" | "-inf"}``, ``{"__bytes__": base64}``,
  ``{"__numpy__": dtype, "value": ...}`` (a numpy scalar).

Ints stay ints and floats stay floats (JSON writes ``1.0`` for a float). A value of any other
type is refused with its path in the state, rather than stored as something it is not.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
import torch

TAGS = ("__tuple__", "__dict__", "__tensor__", "__ndarray__", "__float__", "__bytes__", "__numpy__")


def pack_state(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """(JSON-able skeleton, tensors by name) of ``state``; ``unpack_state`` inverts it."""
    tensors: dict[str, torch.Tensor] = {}
    return _pack(state, "state", tensors), tensors


def _pack(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = value
        return {"__tensor__": name}
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(f"cannot checkpoint a numpy array of objects at {path}")
        name = f"a{len(tensors)}"
        tensors[name] = torch.from_numpy(np.ascontiguousarray(value).reshape(-1).view(np.uint8))
        return {"__ndarray__": name, "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, np.generic):
        return {"__numpy__": value.dtype.str, "value": _pack(value.item(), path, tensors)}
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode()}
    if isinstance(value, tuple):
        return {"__tuple__": [_pack(v, f"{path}[{i}]", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_pack(v, f"{path}[{i}]", tensors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _pack(v, f"{path}[{k!r}]", tensors) for k, v in value.items()}
        return {
            "__dict__": [
                [_pack(k, f"{path} key {k!r}", tensors), _pack(v, f"{path}[{k!r}]", tensors)]
                for k, v in value.items()
            ]
        }
    raise TypeError(f"cannot checkpoint a {type(value).__name__} at {path}")


def unpack_state(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The state that ``pack_state`` took apart."""
    if isinstance(skeleton, list):
        return [unpack_state(v, tensors) for v in skeleton]
    if not isinstance(skeleton, dict):
        return skeleton
    tag = next((key for key in skeleton if key in TAGS), None)
    if tag is None:
        return {k: unpack_state(v, tensors) for k, v in skeleton.items()}
    body = skeleton[tag]
    if tag == "__tuple__":
        return tuple(unpack_state(v, tensors) for v in body)
    if tag == "__dict__":
        return {_hashable(unpack_state(k, tensors)): unpack_state(v, tensors) for k, v in body}
    if tag == "__tensor__":
        return tensors[body]
    if tag == "__ndarray__":
        flat = tensors[body].numpy()
        return flat.view(np.dtype(skeleton["dtype"])).reshape(skeleton["shape"])
    if tag == "__float__":
        return float(body)
    if tag == "__bytes__":
        return base64.b64decode(body)
    return np.dtype(body).type(unpack_state(skeleton["value"], tensors))


def _hashable(key: Any) -> Any:
    if isinstance(key, list):  # only a malformed skeleton gives a list key
        raise ValueError(f"a state dict key decoded to a list: {key!r}")
    return key
