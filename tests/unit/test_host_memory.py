"""A worker's heap keeps what a step frees (``engines/workers/host_memory.py``).

The pattern is a forward pass's: several activations of a few MiB live at once, then all are
freed. glibc's defaults give the freed top of the heap back to the OS, so every round faults
its pages in again (6 blocks of 4 MiB, 6,144 pages: about 3,000 faults a round, measured); kept, a round faults none.
Each case runs in a fresh interpreter, since the settings are the process's for good.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import pytest

from rl_train.engines.workers.host_memory import (
    DEFAULT_KEEP_MIB,
    KEEP_ENV,
    _glibc,
    freeze_built_objects,
    keep_mib_from_env,
)

ROUNDS = """
import json, resource, sys
import numpy as np
from rl_train.engines.workers.host_memory import keep_freed_memory
applied = keep_freed_memory(int(sys.argv[1]))
def one_round():
    blocks = [np.ones(1 << 20, dtype=np.float32) for _ in range(6)]  # 6 x 4 MiB, touched
    del blocks
one_round(); one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    one_round()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
print(json.dumps({"applied": applied, "faults_per_round": faults}))
"""

glibc_only = pytest.mark.skipif(_glibc() is None, reason="the settings are glibc's (mallopt)")


def _faults(keep_mib: int) -> dict[str, float]:
    # glibc's own environment variables would set what the control relies on being its defaults
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", ROUNDS, str(keep_mib)], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc_only
def test_kept_heap_faults_no_pages_in_again() -> None:
    kept = _faults(DEFAULT_KEEP_MIB)
    assert kept["applied"] is True
    assert kept["faults_per_round"] < 50  # 6,144 pages a round, all reused


@glibc_only
def test_glibc_defaults_fault_every_round() -> None:
    """The control: without the settings the same rounds fault most of their pages again
    (else the test above would pass for nothing)."""
    default = _faults(0)
    assert default["applied"] is False
    assert default["faults_per_round"] > 1000


def test_keep_from_env() -> None:
    assert keep_mib_from_env({}) == DEFAULT_KEEP_MIB
    assert keep_mib_from_env({KEEP_ENV: "0"}) == 0
    assert keep_mib_from_env({KEEP_ENV: " 256 "}) == 256
    with pytest.raises(ValueError, match=rf"{KEEP_ENV}: got '-1': expected a whole number of MiB"):
        keep_mib_from_env({KEEP_ENV: "-1"})
    with pytest.raises(ValueError, match="got '1g'"):
        keep_mib_from_env({KEEP_ENV: "1g"})


def test_built_objects_leave_the_collector_s_generations() -> None:
    built = {"engine": [1, 2, 3]}
    try:
        assert freeze_built_objects() > 0
        assert gc.get_freeze_count() > 0
        assert not any(o is built for o in gc.get_objects())  # the full passes skip it
        later = {"result": []}
        assert any(o is later for o in gc.get_objects())  # what the work allocates is collected
    finally:
        gc.unfreeze()
