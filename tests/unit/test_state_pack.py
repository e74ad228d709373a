"""A nested state survives pack -> strict JSON -> unpack with every type it started with."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from rl_train.storage.state_pack import pack_state, unpack_state

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.binary(max_size=8)
)
keys = st.text(max_size=6) | st.integers(-5, 5) | st.tuples(st.integers(0, 3), st.text(max_size=2))
states = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(keys, inner, max_size=4)
    ),
    max_leaves=20,
)


def same(a: Any, b: Any) -> bool:
    """Equal, of the same type all the way down, NaN equal to NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


def through_json(state: Any) -> Any:
    skeleton, tensors = pack_state(state)
    return unpack_state(json.loads(json.dumps(skeleton, allow_nan=False)), tensors)


@given(states)
def test_plain_values_round_trip_with_their_types(state: Any) -> None:
    assert same(through_json(state), state)


def test_dunder_keys_do_not_pass_for_tags() -> None:
    state = {"__tuple__": [1, 2], "x": {"__tensor__": "t0"}}
    assert same(through_json(state), state)


def test_arrays_tensors_and_numpy_scalars() -> None:
    array = np.arange(12, dtype=">u4").reshape(3, 4)[:, ::2]  # big-endian, non-contiguous
    state = {"a": array, "s": np.float32(1.5), "i": np.int64(-3), "t": torch.arange(4).reshape(2, 2).t()}
    back = through_json(state)
    assert back["a"].dtype == array.dtype and np.array_equal(back["a"], array)
    assert type(back["s"]) is np.float32 and back["s"] == np.float32(1.5)
    assert type(back["i"]) is np.int64 and back["i"] == -3
    assert torch.equal(back["t"], state["t"])
