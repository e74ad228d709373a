"""``rollout.weight_sync.mooncake``: the configured protocol and devices are what Mooncake gets.

Mooncake picks RDMA or TCP from its own device scan, so the transport forces the choice: the
config is checked at load, the RDMA devices on the node before the engine starts (a fake
/sys/class/infiniband here), and the TransferEngine's ``initialize`` is recorded (the native
library is the edge of the world: a recording stand-in takes its place) to see that the
protocol, the device filter and ``MC_FORCE_TCP`` reach it, on the sender and on a receiver
built from the sender's descriptor. The real engine over TCP: the conformance suite and the
last test here.
"""

from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from weight_sync_helpers import available_transports

from rl_train.config import ConfigError, load_config
from rl_train.engines.weight_sync.config import MooncakeConfig, WeightSyncConfig
from rl_train.engines.weight_sync.errors import TransportError
from rl_train.engines.weight_sync.transports import mooncake, rdma_devices

MOONCAKE = ["rollout.weight_sync.transport=mooncake", "rollout.weight_sync.backend=bucketed"]


def _load_error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(None, list(overrides))
    return str(caught.value)


def test_a_bad_protocol_names_the_field_the_value_and_the_choices() -> None:
    message = _load_error(*MOONCAKE, "rollout.weight_sync.mooncake.protocol=ib")
    assert "rollout.weight_sync.mooncake.protocol: got 'ib'" in message
    assert "'tcp' or 'rdma'" in message


def test_rdma_without_devices_is_refused_naming_what_it_takes() -> None:
    message = _load_error(*MOONCAKE, "rollout.weight_sync.mooncake.protocol=rdma")
    assert "rollout.weight_sync.mooncake.devices: got [], but protocol 'rdma' needs" in message
    assert "mlx5_0" in message and "'auto'" in message


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"devices": ["mlx5_0"]}, r"got \['mlx5_0'\], but protocol 'tcp' uses no RDMA device"),
        ({"protocol": "rdma", "devices": ["mlx5_0", "../eth0"]}, r"\['../eth0'\] are not RDMA device names"),
        ({"protocol": "rdma", "devices": ["mlx5_0", "mlx5_0"]}, r"names a device twice"),
        ({"protocol": "rdma", "devices": "mlx5_0;mlx5_1"}, r"\['mlx5_0;mlx5_1'\] are not RDMA device names"),
    ],
)
def test_contradictory_or_malformed_devices_are_refused(fields: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationError, match=expected) as caught:
        MooncakeConfig(**fields)
    assert caught.value.errors()[0]["loc"][0] == "devices"


def test_devices_take_mooncakes_comma_spelling_and_auto() -> None:
    config = load_config(None, [*MOONCAKE, "rollout.weight_sync.mooncake.protocol=rdma",
                                "rollout.weight_sync.mooncake.devices=mlx5_0,mlx5_1"])  # fmt: skip
    assert config.rollout.weight_sync.mooncake.devices == ["mlx5_0", "mlx5_1"]
    assert MooncakeConfig(protocol="rdma", devices="auto").devices == "auto"


def test_rdma_set_where_mooncake_is_not_used_is_a_contradiction() -> None:
    message = _load_error("rollout.weight_sync.transport=tcp", "rollout.weight_sync.backend=bucketed",
                          "rollout.weight_sync.mooncake.protocol=rdma", "rollout.weight_sync.mooncake.devices=auto")  # fmt: skip
    assert "rollout.weight_sync.mooncake.protocol: 'rdma' is set, but backend 'bucketed' over transport 'tcp'" in message


def _fake_device(root: Path, name: str, state: str = "4: ACTIVE", gids: bool = True, verbs: bool = True) -> None:
    """A sysfs entry as the kernel lays it out, its verbs node a link to /dev/null (a character
    device anyone may open read-write, as a real uverbs node is for its users)."""
    folder = root / "sys" / name
    port = folder / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    (port / "state").write_text(f"{state}\n")
    if gids:
        (port / "gids" / "0").write_text("fe80:0000:0000:0000:0000:0000:0000:0001\n")
    index = len(list((root / "sys").iterdir()))
    (folder / "device" / "infiniband_verbs" / f"uverbs{index}").mkdir(parents=True)
    (root / "dev").mkdir(exist_ok=True)
    if verbs:
        (root / "dev" / f"uverbs{index}").symlink_to("/dev/null")


@pytest.fixture
def sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "sys").mkdir()
    monkeypatch.setattr(rdma_devices, "SYSFS_INFINIBAND", tmp_path / "sys")
    monkeypatch.setattr(rdma_devices, "DEV_INFINIBAND", tmp_path / "dev")
    return tmp_path


def test_devices_are_checked_on_the_node_as_mooncakes_scan_would(sysfs: Path) -> None:
    _fake_device(sysfs, "mlx5_0")
    _fake_device(sysfs, "mlx5_1", state="1: DOWN")
    _fake_device(sysfs, "mlx5_2", gids=False)
    _fake_device(sysfs, "mlx5_3", verbs=False)
    _fake_device(sysfs, "mlx5_4")
    assert rdma_devices.resolve_devices("auto") == ["mlx5_0", "mlx5_4"]
    assert rdma_devices.resolve_devices(["mlx5_4"]) == ["mlx5_4"]
    with pytest.raises(TransportError) as caught:
        rdma_devices.resolve_devices(["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_9"])
    message = caught.value.reason
    assert message.startswith("rollout.weight_sync.mooncake.devices: ['mlx5_0', 'mlx5_1',")
    assert "mlx5_1: no active port with GID entries (port 1: 1: DOWN)" in message
    assert "mlx5_2: no active port with GID entries (port 1: 4: ACTIVE)" in message
    assert re.search(r"mlx5_3: \S+/dev/uverbs\d is not a character device", message)
    assert f"mlx5_9: no {sysfs / 'sys' / 'mlx5_9'}" in message
    assert message.endswith("usable on this node: mlx5_0, mlx5_4")
    assert "mlx5_0:" not in message


def test_auto_on_a_node_without_rdma_devices_fails_instead_of_falling_back(sysfs: Path) -> None:
    with pytest.raises(TransportError, match=r"mooncake.devices: 'auto' found no usable RDMA device .*lists no device"):
        rdma_devices.resolve_devices("auto")
    _fake_device(sysfs, "mlx5_0", state="1: DOWN")
    with pytest.raises(TransportError, match=r"'auto' found no usable RDMA device on this node \(mlx5_0: no active port"):
        rdma_devices.resolve_devices("auto")


class RecordingEngine:
    """Stands in for mooncake.engine.TransferEngine: records each ``initialize`` with the
    ``MC_FORCE_TCP`` it saw, and keeps the few calls the transport makes."""

    calls: list[tuple[tuple[str, ...], str | None]] = []
    status = 0

    def initialize(self, *args: str) -> int:
        RecordingEngine.calls.append((args, os.environ.get("MC_FORCE_TCP")))
        return RecordingEngine.status

    def register_memory(self, address: int, length: int) -> int:
        return 0

    def unregister_memory(self, address: int) -> int:
        return 0

    def get_rpc_port(self) -> int:
        return 15000


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[str, ...], str | None]]:
    module = types.ModuleType("mooncake.engine")
    module.TransferEngine = RecordingEngine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mooncake.engine", module)
    monkeypatch.setattr(RecordingEngine, "calls", [])
    monkeypatch.setattr(RecordingEngine, "status", 0)
    return RecordingEngine.calls


def _sender(**mooncake_fields: Any) -> mooncake.Sender:
    """The sender transport as the stream builds it from a loaded config."""
    cfg = WeightSyncConfig(backend="bucketed", transport="mooncake", bucket_size_bytes=4096, mooncake=mooncake_fields)
    return mooncake.Sender(cfg.bucket_size_bytes, "127.0.0.1", cfg.transport_options())


def test_tcp_reaches_initialize_with_tcp_forced_and_the_environment_restored(
    recorded: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    sender = _sender()
    receiver = mooncake.Receiver({**sender.descriptor(), "host": "127.0.0.1", "bucket_size_bytes": 4096})
    assert recorded == [(("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), "1")] * 2
    assert "MC_FORCE_TCP" not in os.environ
    sender.close()
    receiver.close()


def test_rdma_reaches_initialize_with_the_devices_and_tcp_not_forced(
    recorded: list, sysfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("mlx5_0", "mlx5_1", "mlx5_2"):
        _fake_device(sysfs, name)
    monkeypatch.setenv("MC_FORCE_TCP", "1")  # left in the environment by someone else
    sender = _sender(protocol="rdma", devices=["mlx5_2", "mlx5_0"])
    descriptor = sender.descriptor()
    assert descriptor["mooncake"] == {"protocol": "rdma", "devices": ["mlx5_2", "mlx5_0"]}
    mooncake.Receiver({**descriptor, "host": "127.0.0.1", "bucket_size_bytes": 4096})
    _sender(protocol="rdma", devices="auto")
    assert recorded == [
        (("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_2,mlx5_0"), None),
        (("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_2,mlx5_0"), None),
        (("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0,mlx5_1,mlx5_2"), None),
    ]
    assert os.environ["MC_FORCE_TCP"] == "1"


def test_rdma_with_a_missing_device_never_starts_an_engine(recorded: list, sysfs: Path) -> None:
    _fake_device(sysfs, "mlx5_0")
    with pytest.raises(TransportError, match=r"mooncake.devices: \['mlx5_1'\] cannot all be used"):
        _sender(protocol="rdma", devices=["mlx5_1"])
    assert recorded == []


def test_a_failed_initialise_names_the_protocol_and_devices(
    recorded: list, sysfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_device(sysfs, "mlx5_0")
    monkeypatch.setattr(RecordingEngine, "status", -1)
    with pytest.raises(TransportError, match=r"failed to initialise on 127.0.0.1 over rdma on mlx5_0"):
        mooncake.start_engine("127.0.0.1", "rdma", ["mlx5_0"])


@pytest.mark.skipif("mooncake" not in available_transports(), reason="the mooncake transport is not installed here")
def test_the_real_engine_is_told_to_stay_on_tcp(capfd: pytest.CaptureFixture[str]) -> None:
    """What Mooncake itself logs at ``initialize``: it read MC_FORCE_TCP and installed TCP only."""
    engine = mooncake.start_engine("127.0.0.1", **MooncakeConfig().model_dump(exclude={"direct"}))
    assert engine.get_rpc_port() > 0
    assert "MC_FORCE_TCP is set, using TCP transport only" in capfd.readouterr().err


def test_only_the_chosen_transport_gets_its_section() -> None:
    rdma = {"protocol": "rdma", "devices": ["mlx5_0"]}
    chosen = WeightSyncConfig(backend="delta", transport="mooncake", mooncake=rdma)
    assert chosen.transport_options() == {**rdma, "direct": False}
    assert WeightSyncConfig(backend="bucketed", transport="tcp").transport_options() == {}
