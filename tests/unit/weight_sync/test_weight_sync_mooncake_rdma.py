"""Mooncake over RDMA, bit-exact, on a machine with an active RDMA device.

Marked ``gpu``: RDMA devices come with the GPU machines, and ``scripts/gpu_check.sh`` runs this
file on its own where the node has a usable device (its ``gpu`` step leaves it out). On a GPU
machine without one it fails, naming what the node has under /sys/class/infiniband: only the
``gpu`` and ``slow`` markers may skip a test.

The sender's own Mooncake log is read back to show that the engine found RDMA devices and
installed its RDMA transport: the transport refuses to start ``rdma`` without a usable
device, and this is the check that Mooncake did not fall back to TCP on its own.
"""

from __future__ import annotations

import re

import pytest
from weight_sync_helpers import assert_same_weights, available_transports, make_weights
from weight_sync_pair import SyncPair

from rl_train.engines.weight_sync.transports import rdma_devices


def _no_rdma_here() -> str:
    if "mooncake" not in available_transports():
        return "the mooncake transport is not installed here"
    if any(not device.problem for device in rdma_devices.list_devices()):
        return ""
    return f"no usable RDMA device on this node ({rdma_devices.describe_devices()})"


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(_no_rdma_here()), reason=_no_rdma_here() or "RDMA available")]


@pytest.mark.parametrize("backend", ["bucketed", "delta"])
def test_rdma_round_trip_is_bit_exact(peer, backend: str, capfd: pytest.CaptureFixture[str]) -> None:
    pair = SyncPair(peer, backend, "mooncake", make_weights(0), mooncake={"protocol": "rdma", "devices": "auto"})
    try:
        log = capfd.readouterr().err
        found = re.search(r"Topology discovery complete\. Found (\d+) HCAs", log)
        assert found and int(found.group(1)) > 0, log[-2000:]
        assert "installTransport, type=rdma" in log, log[-2000:]
        assert "MC_FORCE_TCP is set" not in log
        for version, seed in ((1, 0), (2, 1)):
            weights = make_weights(seed)
            _, reply = pair.sync(weights, version)
            assert reply[0] == "ok", reply
            assert_same_weights(reply[2], weights)
            assert reply[3] == version
    finally:
        pair.close()
