#!/usr/bin/env bash
# Build the wheel, install it (not editable) into a fresh venv, and use it from outside the
# repository: every module of the tree must be in it, `rl-train config --show` must work, and
# so must a 2-step `--no-prefect` run that creates its own tiny model and data.
# Editable installs resolve modules from the tree, so only this catches a module the wheel lacks.
# Offline: the build backend, the wheel's dependencies and the CPU torch come from the
# machine's package index.
set -euo pipefail
cd "$(dirname "$0")/.."
# this interpreter only drives pip (the build runs in pip's isolated env) and makes the venv
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
PYTHON=$(command -v "$PYTHON")

WORK=$(mktemp -d -t rl-train-wheel.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/src" "$WORK/dist" "$WORK/outside"

# tracked and new (not ignored) files only: no stale build/ or egg-info can leak into the wheel
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  if [ -e "$f" ]; then printf '%s\0' "$f"; fi
done | tar --null -T - -cf - | tar -xf - -C "$WORK/src"
"$PYTHON" -m pip wheel -q --no-deps -w "$WORK/dist" "$WORK/src"
WHEEL=$(ls "$WORK"/dist/rl_train-*.whl)

# every .py file under src/ must be in the wheel, at the same path
"$PYTHON" - "$WORK/src" "$WHEEL" <<'PY'
import sys
import zipfile
from pathlib import Path

src, wheel = Path(sys.argv[1]) / "src", sys.argv[2]
expected = {path.relative_to(src).as_posix() for path in src.rglob("*.py")}
missing = sorted(expected - set(zipfile.ZipFile(wheel).namelist()))
if missing:
    sys.exit(f"wheel check: FAILED: the wheel lacks {len(missing)} modules: " + ", ".join(missing))
print(f"wheel check: the wheel holds all {len(expected)} modules of the tree", file=sys.stderr)
PY

"$PYTHON" -m venv "$WORK/venv"
# --no-compile: byte-compiling torch and ray would take longer than the rest of the check
"$WORK/venv/bin/python" -m pip install -q --no-compile "$WHEEL" torch==2.13.0 \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

# from a folder outside the repository, so nothing can be imported from the tree
cd "$WORK/outside"
RL_TRAIN=$WORK/venv/bin/rl-train
env -u PYTHONPATH "$RL_TRAIN" config --show >"$WORK/config.yaml"
grep -q '^trainer:' "$WORK/config.yaml" || { echo "wheel check: FAILED: config --show printed no trainer section" >&2; exit 1; }
env -u PYTHONPATH RL_TRAIN_RAY_TMPDIR="$WORK/ray" "$RL_TRAIN" train --no-prefect \
  trainer.total_steps=2 trainer.train_batch_size=4 trainer.val_every_steps=0 trainer.val_before_train=false \
  rollout.n=2 actor.ppo_mini_batch_size=2 model.pretrain_steps=0 ray.num_cpus=2 \
  run.output_dir="$WORK/runs" model.path="$WORK/model" data.data_dir="$WORK/data" >"$WORK/summary.json"
steps=$(wc -l <"$WORK/runs/arith-tiny/metrics.jsonl")
if [ "$steps" != 2 ]; then
  echo "wheel check: FAILED: expected 2 steps in metrics.jsonl, found $steps" >&2
  exit 1
fi
echo "wheel check: ok ($(basename "$WHEEL") in a clean venv: config --show and a 2-step run)" >&2
