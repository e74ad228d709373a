#!/usr/bin/env bash
# Install everything the test suite needs into .venv and run it (the README's test command).
# On a fresh machine this is all the set-up there is: CPU torch from its pinned wheel, the test
# tools, megatron-core (its CPU tests), PEFT (LoRA), the CPU build of Mooncake (and, as root, the
# libibverbs1 system library it loads) and bubblewrap, the sandbox of untrusted code.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! ldconfig -p 2>/dev/null | grep -q libibverbs.so.1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null
  else
    # only the gpu and slow markers may skip a test (tests/skip_policy.py): these fail without it
    echo "note: libibverbs1 is missing and this is not root: the Mooncake tests will fail;" \
      "install it with: sudo apt-get install -y libibverbs1" >&2
  fi
fi

# the sandbox tests run untrusted code under bubblewrap (engines/sandbox)
if ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
  else
    echo "note: bubblewrap is missing and this is not root: the sandbox tests will fail;" \
      "install it with: sudo apt-get install -y bubblewrap" >&2
  fi
fi

# a venv left half-made by an interrupted run (no pip in it) is made again
.venv/bin/python -m pip --version >/dev/null 2>&1 || python3 -m venv --clear .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[cpu,test,mooncake-cpu,megatron,lora]'
# sglang's request/response types for the CPU sglang test server (pyproject extra sglang-schemas)
.venv/bin/python -m pip install -q --no-deps 'sglang==0.5.9'

export RAY_AUTH_MODE=disabled
status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ "$status" = 5 ]; then
  echo "pytest collected no tests: that is a broken run, not a green one" >&2
  exit 1
fi
exit "$status"
