"""Plugin registration: the version rule, plugin-info validation and a real gRPC round trip."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from e2e.kubelet_peer.health import HealthStore
from e2e.kubelet_peer.model import ClaimRef, DriverCallError
from e2e.kubelet_peer.protos import DRA_SERVICES, HEALTH_SERVICES, REGISTRATION_SERVICE, Protos, load_protos
from e2e.kubelet_peer.registration import (
    Accepted,
    PluginManager,
    Rejected,
    discover_sockets,
    negotiate_version,
    validate_plugin_info,
)

DRIVER = "gpu.example.com"


@pytest.mark.parametrize(
    ("supported", "expected"),
    [
        (["v1.DRAPlugin", "v1beta1.DRAPlugin"], "v1.DRAPlugin"),
        (["v1beta1.DRAPlugin", "v1.DRAPlugin"], "v1beta1.DRAPlugin"),  # the plugin's order wins
        (["v1alpha1.DRAResourceHealth", "v1beta1.DRAPlugin"], "v1beta1.DRAPlugin"),
        (["v1alpha3.NodeService"], None),  # no legacy fallback
        (["1.0.0"], None),
        ([], None),
    ],
)
def test_negotiate_version(supported: list[str], expected: str | None) -> None:
    assert negotiate_version(supported) == expected


def test_validate_plugin_info() -> None:
    ok = validate_plugin_info("DRAPlugin", DRIVER, "", ["v1.DRAPlugin", "v1alpha1.DRAResourceHealth"], "/r/x.sock")
    assert ok == Accepted(driver=DRIVER, endpoint="/r/x.sock", version="v1.DRAPlugin", health="v1alpha1.DRAResourceHealth")
    # Like the 1.37 kubelet: v1 health is preferred whatever the plugin's order.
    both = validate_plugin_info("DRAPlugin", DRIVER, "", ["v1.DRAPlugin", "v1alpha1.DRAResourceHealth",
                                                          "v1.DRAResourceHealth"], "/r/x.sock")
    assert isinstance(both, Accepted) and both.health == "v1.DRAResourceHealth"
    no_health = validate_plugin_info("DRAPlugin", DRIVER, "", ["v1.DRAPlugin"], "/r/x.sock")
    assert isinstance(no_health, Accepted) and no_health.health is None
    assert isinstance(validate_plugin_info("CSIPlugin", DRIVER, "/e", ["v1.DRAPlugin"], "/r"), Rejected)
    assert isinstance(validate_plugin_info("DRAPlugin", "", "/e", ["v1.DRAPlugin"], "/r"), Rejected)
    assert isinstance(validate_plugin_info("DRAPlugin", DRIVER, "rel/dra.sock", ["v1.DRAPlugin"], "/r"), Rejected)
    assert isinstance(validate_plugin_info("DRAPlugin", DRIVER, "/e", ["v9.DRAPlugin"], "/r"), Rejected)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def wait_for(cond: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


class FakePlugin:
    """A tiny DRA plugin: registration + DRA v1/v1beta1 + health, built from the same protos."""

    def __init__(self, protos: Protos, reg_dir: str, plugin_dir: str, versions: list[str]) -> None:
        self.notifications: list[tuple[bool, str]] = []
        self.prepared: list[list[str]] = []
        self.reg_sock = os.path.join(reg_dir, f"{DRIVER}-reg.sock")
        self.dra_sock = os.path.join(plugin_dir, "dra.sock")
        info = protos.message("pluginregistration.PluginInfo")(
            type="DRAPlugin", name=DRIVER, endpoint=self.dra_sock, supported_versions=versions
        )
        status_resp = protos.message("pluginregistration.RegistrationStatusResponse")

        def notify(req: Any, ctx: Any) -> Any:
            self.notifications.append((req.plugin_registered, req.error))
            return status_resp()

        handlers = [
            protos.server_handler(REGISTRATION_SERVICE, {"GetInfo": lambda req, ctx: info, "NotifyRegistrationStatus": notify})
        ]
        for service in DRA_SERVICES.values():
            pkg = service.rsplit(".", 1)[0]
            resp_t = protos.message(f"{pkg}.NodePrepareResourcesResponse")
            one_t = protos.message(f"{pkg}.NodePrepareResourceResponse")
            dev_t = protos.message(f"{pkg}.Device")

            def prepare(req: Any, ctx: Any, resp_t: Any = resp_t, one_t: Any = one_t, dev_t: Any = dev_t) -> Any:
                self.prepared.append([c.uid for c in req.claims])
                out = resp_t()
                for c in req.claims:
                    out.claims[c.uid].CopyFrom(
                        one_t(
                            devices=[dev_t(pool_name="node", device_name="gpu-0", cdi_device_ids=[f"k8s.{DRIVER}/gpu={c.uid}"])]
                        )
                    )
                return out

            handlers.append(protos.server_handler(service, {"NodePrepareResources": prepare}))
        for service in (h for h in HEALTH_SERVICES if h in versions):
            pkg = service.split(".", 1)[0]
            health_resp = protos.message(f"{pkg}.NodeWatchResourcesResponse")
            dh = protos.message(f"{pkg}.DeviceHealth")
            di = protos.message(f"{pkg}.DeviceIdentifier")

            def watch(req: Any, ctx: Any, health_resp: Any = health_resp, dh: Any = dh, di: Any = di,
                      message: str = f"XID 79 ({pkg})") -> Iterator[Any]:
                device = di(pool_name="node", device_name="gpu-0")
                yield health_resp(devices=[dh(device=device, health=2, last_updated_time=123, message=message)])
                while ctx.is_active():
                    time.sleep(0.05)

            handlers.append(protos.server_handler(service, {"NodeWatchResources": watch}))
        self.server = grpc.server(ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers(handlers)
        self.server.add_insecure_port("unix:" + self.dra_sock)
        self.server.add_insecure_port("unix:" + self.reg_sock)
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None).wait()
        for s in (self.reg_sock, self.dra_sock):
            if os.path.exists(s):
                os.unlink(s)


@pytest.fixture
def dirs() -> Iterator[tuple[str, str, Path]]:
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer.
    base = tempfile.mkdtemp(prefix="peer-", dir="/tmp")
    reg, plug, state = (os.path.join(base, d) for d in ("reg", "plug", "state"))
    for d in (reg, plug, state):
        os.mkdir(d)
    yield reg, plug, Path(state)
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize(("health_versions", "watched"), [
    (["v1alpha1.DRAResourceHealth"], "v1alpha1"),  # a 1.36-era plugin
    (["v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"], "v1"),  # both: v1 wins, as in the 1.37 kubelet
])
def test_registration_round_trip(dirs: tuple[str, str, Path], health_versions: list[str], watched: str) -> None:
    reg_dir, plug_dir, state_dir = dirs
    protos = load_protos()
    plugin = FakePlugin(protos, reg_dir, plug_dir, ["v1.DRAPlugin", "v1beta1.DRAPlugin", *health_versions])
    clock = FakeClock()
    wipes: list[str] = []
    mgr = PluginManager(
        reg_dir, protos, on_wipe=wipes.append, health_store=HealthStore(state_dir / "health.json"), wipe_delay=30.0, clock=clock
    )
    try:
        # A dot-file socket is invisible to the watcher.
        hidden = socket.socket(socket.AF_UNIX)
        hidden.bind(os.path.join(reg_dir, ".hidden-reg.sock"))
        assert list(discover_sockets(reg_dir)) == [plugin.reg_sock]
        hidden.close()
        mgr.scan()
        wait_for(lambda: plugin.notifications)
        assert plugin.notifications == [(True, "")]
        inst = mgr.drivers()[DRIVER][0]
        assert (inst.version, inst.endpoint, inst.health) == ("v1.DRAPlugin", plugin.dra_sock, f"{watched}.DRAResourceHealth")

        res = mgr.prepare(DRIVER, [ClaimRef("ns", "c", "uid-1")])
        assert plugin.prepared == [["uid-1"]]
        assert res["uid-1"].error == ""
        assert res["uid-1"].devices[0].cdi_device_ids == (f"k8s.{DRIVER}/gpu=uid-1",)

        health = wait_for(lambda: (state_dir / "health.json").exists() and json.loads((state_dir / "health.json").read_text()))
        assert health == {DRIVER: {"node/gpu-0": {"health": "Unhealthy", "message": f"XID 79 ({watched})", "last_updated": 123}}}

        # Rescanning does not register twice.
        mgr.scan()
        time.sleep(0.2)
        assert len(plugin.notifications) == 1

        wait_for(lambda: inst.connected)
        mgr.check_wipe()
        assert wipes == []

        plugin.stop()
        mgr.scan()
        assert DRIVER not in mgr.drivers()
        with pytest.raises(DriverCallError, match="not registered"):
            mgr.prepare(DRIVER, [ClaimRef("ns", "c", "uid-1")])
        mgr.check_wipe()  # starts the timer
        clock.t += 29
        mgr.check_wipe()
        assert wipes == []
        clock.t += 2
        mgr.check_wipe()
        mgr.check_wipe()
        assert wipes == [DRIVER]  # exactly once per outage
        wait_for(lambda: json.loads((state_dir / "health.json").read_text()) == {})
    finally:
        mgr.close()
        plugin.stop()


def test_registration_rejected_and_retried(dirs: tuple[str, str, Path]) -> None:
    reg_dir, plug_dir, _ = dirs
    protos = load_protos()
    plugin = FakePlugin(protos, reg_dir, plug_dir, ["v1alpha3.NodeService"])
    clock = FakeClock()
    mgr = PluginManager(reg_dir, protos, clock=clock)
    try:
        mgr.scan()
        wait_for(lambda: plugin.notifications)
        registered, error = plugin.notifications[0]
        assert not registered and "none of the supported versions" in error
        assert mgr.drivers() == {}
        wait_for(lambda: not mgr._in_flight)
        mgr.scan()  # backoff not expired yet
        time.sleep(0.2)
        assert len(plugin.notifications) == 1
        clock.t += 1
        mgr.scan()
        wait_for(lambda: len(plugin.notifications) == 2)
    finally:
        mgr.close()
        plugin.stop()


def test_v1beta1_negotiated_service_is_used(dirs: tuple[str, str, Path]) -> None:
    reg_dir, plug_dir, _ = dirs
    protos = load_protos()
    plugin = FakePlugin(protos, reg_dir, plug_dir, ["v1beta1.DRAPlugin"])
    mgr = PluginManager(reg_dir, protos)
    try:
        mgr.scan()
        wait_for(lambda: mgr.drivers().get(DRIVER))
        assert mgr.drivers()[DRIVER][0].version == "v1beta1.DRAPlugin"
        res = mgr.prepare(DRIVER, [ClaimRef("ns", "c", "u2")])
        assert res["u2"].devices[0].share_id is None
    finally:
        mgr.close()
        plugin.stop()


def test_protos_coexist_with_default_pool() -> None:
    # The peer's private pool must not clash with anything in the default descriptor pool.
    from google.protobuf import descriptor_pool

    p = load_protos()
    assert p.message("k8s.io.kubelet.pkg.apis.dra.v1.Device").DESCRIPTOR.file.pool is not descriptor_pool.Default()
