#!/usr/bin/env bash
# On a machine with a CUDA GPU: install with the CUDA extras that exist today and run the
# gpu-marked tests plus the weight-sync conformance suite and benchmark (NCCL, CUDA tensors).
# Everything here is skipped or not installed on CPU-only machines and in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q -e '.[test]' torch
export RAY_AUTH_MODE=disabled
.venv/bin/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible'; print(torch.cuda.get_device_name(0))"
.venv/bin/python -m pytest -q -m gpu tests
.venv/bin/python -m pytest -q tests/unit/weight_sync
.venv/bin/python -m rl_train.bench.weight_sync --size-mb 256
