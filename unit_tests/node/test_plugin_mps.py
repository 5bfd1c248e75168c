"""The plugin's watch over its MPS control daemons: a dead one is started again, and its GPU's
devices are Unhealthy to the kubelet meanwhile, and for as long as it cannot be started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nodefix import GPU0_UUID as GPU0
from nodefix import MpsEnv, make_claim, share

from dra_driver.node.plugin import check_mps_daemons
from dra_driver.node.prepare.mps import Defaults
from dra_driver.node.publish.healthboard import HealthBoard


def health(board: HealthBoard) -> dict[str, tuple[str, str]]:
    return {r.device_name: (r.health, r.message) for r in board.snapshot()[1]}


class Recording(HealthBoard):
    def __init__(self, names: Any) -> None:
        super().__init__(names)
        self.seen: list[tuple[str, str]] = []

    def update(self, device_name: str, health: str, message: str = "") -> None:
        self.seen.append((device_name, health))
        super().update(device_name, health, message)


def test_a_dead_daemon_is_started_again_and_its_devices_unhealthy_meanwhile(tmp_path: Path) -> None:
    env = MpsEnv(tmp_path)
    ref = env.reader.add(make_claim("a", [share("gpu-0", "10Gi")], config=[{"source": "FromClaim", "requests": [],
        "opaque": {"driver": "gpu.dra-driver.io", "parameters": {"apiVersion": "gpu.dra-driver.io/v1alpha1",
                                                                 "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}}}]))
    assert env.state.prepare([ref])[ref.uid].ok
    board = Recording(sorted(env.devices))
    assert check_mps_daemons(env.state, env.devices, board) == [] and board.seen == []
    del env.daemons.live[GPU0]  # it died
    assert check_mps_daemons(env.state, env.devices, board) == [GPU0]
    assert board.seen == [("gpu-0", "Unhealthy"), ("gpu-0", "Healthy")]
    assert env.daemons.live == {GPU0: Defaults(None, 10 * 2**30)}
    del env.daemons.live[GPU0]
    env.daemons.fail = "MPS needs nvidia-cuda-mps-control from the NVIDIA driver, and there is none"
    check_mps_daemons(env.state, env.devices, board)
    assert health(board)["gpu-0"] == ("Unhealthy", f"MPS control daemon: {env.daemons.fail}")
    env.daemons.fail = None
    check_mps_daemons(env.state, env.devices, board)
    assert health(board)["gpu-0"] == ("Healthy", "") and GPU0 in env.daemons.live
    board.update("gpu-0", "Unhealthy", "XID 79: the GPU fell off the bus")  # the NVML health monitor's
    del env.daemons.live[GPU0]
    check_mps_daemons(env.state, env.devices, board)
    assert health(board)["gpu-0"] == ("Unhealthy", "XID 79: the GPU fell off the bus"), \
        "the daemon's return does not clear what another health source found"
