#!/usr/bin/env bash
# The device check: one command for a machine with one NVIDIA GPU and no internet.
#
#   bash scripts/gpu_check.sh [WHEELS_DIR]
#
# The packages it needs (a CUDA torch, megatron-core, sglang, the CUDA Mooncake wheel) are
# preinstalled in .venv or carried in as wheels in WHEELS_DIR (installed with --no-index: this
# script never reaches the network). It runs, each step on its own so that one failure does not
# hide the others:
#   - the gpu-marked tests: NCCL weight sync, the delta diff on the device, the megatron engine
#     on CUDA, the sglang backend on a launched sglang server;
#   - Mooncake over RDMA (rollout.weight_sync.mooncake.protocol: rdma, devices: auto), when this
#     machine has a usable RDMA device under /sys/class/infiniband; otherwise the step is
#     reported as skipped, naming what the machine has, and Mooncake is checked over TCP only;
#   - the engine and weight-sync conformance suites with CUDA visible;
#   - the benchmarks: training tokens/s torch vs megatron, weight sync delta vs full with the
#     diff on the device.
# and writes one summary table (gpu_check_summary.md, printed at the end): each step, its
# status, and its figures. Steps whose packages are missing are reported as skipped, by name.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${GPU_CHECK_OUT:-gpu_check_out}"
mkdir -p "$OUT"
PY=.venv/bin/python
[ -x "$PY" ] || python3 -m venv .venv
if [ "${1:-}" != "" ]; then
  "$PY" -m pip install -q --no-index --find-links "$1" -e '.[test]' megatron-core sglang mooncake-transfer-engine || true
fi
export RAY_AUTH_MODE=disabled
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible'; print(torch.cuda.get_device_name(0))" \
  | tee "$OUT/device.txt" || { echo "no CUDA device: nothing to check" >&2; exit 1; }

SUMMARY="$OUT/gpu_check_summary.md"
printf '| step | status | figures |\n| --- | --- | --- |\n' > "$SUMMARY"

step() {  # step NAME FIGURE_PATTERN COMMAND...
  local name="$1" pattern="$2"
  shift 2
  local log="$OUT/$name.log"
  echo "== $name"
  "$@" > "$log" 2>&1
  local status=$?
  local verdict="passed"
  if [ $status -eq 5 ]; then verdict="nothing collected"; elif [ $status -ne 0 ]; then verdict="**failed** ($status)"; fi
  local figures
  figures=$(grep -E "$pattern" "$log" | tail -6 | sed 's/|/\\|/g' | tr '\n' ';' | sed 's/;$//; s/;/<br>/g')
  printf '| %s | %s | %s |\n' "$name" "$verdict" "$figures" >> "$SUMMARY"
}

# the RDMA round trip runs in its own step below, only where the node has a usable device
step gpu-tests "passed|failed|skipped" "$PY" -m pytest -q -rs -m gpu tests \
  --deselect tests/unit/weight_sync/test_weight_sync_mooncake_rdma.py

# RDMA devices as the mooncake transport judges them (the same sysfs facts Mooncake's scan reads).
rdma_devices=$("$PY" -c 'from rl_train.engines.weight_sync.transports.rdma_devices import describe_devices
print(describe_devices())' 2>&1)
echo "RDMA devices: $rdma_devices" | tee "$OUT/rdma_devices.txt"
MOONCAKE_BENCH=(--mooncake-protocol tcp)
if grep -qE ': usable(;|$)' <<< "$rdma_devices"; then
  MOONCAKE_BENCH=(--mooncake-protocol rdma --mooncake-devices auto)
  step mooncake-rdma "passed|failed|skipped|SKIPPED" \
    "$PY" -m pytest -q -rs tests/unit/weight_sync/test_weight_sync_mooncake_rdma.py
else
  reason="no usable RDMA device ($rdma_devices): Mooncake checked over TCP only"
  echo "== mooncake-rdma: SKIPPED, $reason"
  printf '| %s | %s | %s |\n' mooncake-rdma "skipped" "$(sed 's/|/\\|/g' <<< "$reason")" >> "$SUMMARY"
fi
# The sglang cases of the engine suite attach to the CPU test server, which holds requests to
# sglang 0.5.9's own types (tests/unit/sglang/sglang_schemas.py): they run in CI, not against the
# sglang this machine serves with (the gpu-tests step runs the backend on a launched server).
step conformance "passed|failed|skipped" "$PY" -m pytest -q tests/unit/test_engine_conformance.py tests/unit/weight_sync -k "not sglang" \
  --deselect tests/unit/weight_sync/test_weight_sync_mooncake_rdma.py
step bench-training-engines "tokens/s|megatron / torch" "$PY" -m rl_train.bench.training_engines --rows 64 --length 256
step bench-weight-sync "delta|full|MB/s|mooncake over" "$PY" -m rl_train.bench.weight_sync --size-mb 256 "${MOONCAKE_BENCH[@]}"

echo
cat "$SUMMARY"
