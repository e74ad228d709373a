#!/usr/bin/env bash
# Type-check the whole package with the pinned mypy (the `test` extra; settings in
# pyproject.toml [tool.mypy]): any error fails, an unresolved first-party import included.
# Run after scripts/test.sh has made .venv; VENV names another environment. Extra arguments go
# to mypy (e.g. --cache-dir DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
if [ ! -x "$venv/bin/mypy" ]; then
  echo "no mypy in $venv: install the test extra (bash scripts/test.sh does), or set VENV" >&2
  exit 2
fi
"$venv/bin/mypy" --version
exec "$venv/bin/mypy" "$@"
