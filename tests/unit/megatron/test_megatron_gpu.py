"""The megatron engine on CUDA (``gpu``-marked; ``scripts/gpu_check.sh`` runs it): megatron's own
CUDA paths, without the CPU layer, against the torch engine on the host (``gpu_checks.py``, in
a process of its own). Tolerances are wider than on CPU: GPU kernels sum in other orders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import megatron.core  # noqa: F401  (without a working megatron-core these tests fail, never skip)
import pytest

pytestmark = pytest.mark.gpu

CHECKS = Path(__file__).with_name("gpu_checks.py")


@pytest.fixture(scope="module")
def measured(tiny_model_dir: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(CHECKS), str(tiny_model_dir)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_megatron_on_cuda_matches_the_torch_engine(measured: dict[str, Any]) -> None:
    assert measured["device"].startswith("cuda"), measured
    assert measured["log_prob_diff"] < 1e-4, measured
    assert measured["loss_rel_diff"] < 1e-4 and measured["grad_norm_rel_diff"] < 1e-3, measured
    assert measured["same_names"] and measured["resumed_bit_exact"], measured
