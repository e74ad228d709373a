#!/usr/bin/env bash
# Install rl-train into .venv and run the main job: the tiny policy learns single-digit sums on
# CPU, every phase a Prefect task (local API with SQLite), every model in a local Ray actor.
set -euo pipefail
cd "$(dirname "$0")/.."
# a venv left half-made by an interrupted run (no pip in it) is made again
.venv/bin/python -m pip --version >/dev/null 2>&1 || python3 -m venv --clear .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[cpu]'
export RAY_AUTH_MODE=disabled
exec .venv/bin/rl-train train --config configs/arith-tiny.yaml "$@"
