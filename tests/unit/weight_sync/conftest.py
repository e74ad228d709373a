"""Fixtures of the weight-sync conformance suite.

The helper modules beside this file are imported by plain name, here and in the spawned
peer processes (which inherit ``sys.path``), whatever pytest's import mode.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from weight_sync_peers import Peer  # noqa: E402


@pytest.fixture(scope="session")
def peer() -> Iterator[Peer]:
    """One spawned rollout-side process that hosts the receivers of every test."""
    process = Peer()
    yield process
    process.stop()
