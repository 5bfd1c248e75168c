"""The registration and DRA gRPC servers, over real Unix sockets."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver._proto.dra.v1 import api_pb2 as v1
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.dra.v1beta1 import api_pb2 as v1beta1
from dra_driver._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver._proto.drahealth.v1 import api_pb2 as health_v1
from dra_driver._proto.drahealth.v1 import api_pb2_grpc as health_v1_grpc
from dra_driver._proto.drahealth.v1alpha1 import api_pb2 as health
from dra_driver._proto.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from dra_driver._proto.pluginregistration import api_pb2 as reg
from dra_driver._proto.pluginregistration import api_pb2_grpc as reg_grpc
from dra_driver.k8s.client import ApiError, Resource
from dra_driver.node.describe.devices import AllocatableDevice
from dra_driver.node.discovery.model import Gpu, PciInfo
from dra_driver.node.kubelet.grpc import SUPPORTED_VERSIONS, PluginServers
from dra_driver.node.prepare.calls import ClaimRef, PrepareOutcome, ResponseDevice
from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.checkpoint import CheckpointStore
from dra_driver.node.prepare.state import DeviceState
from dra_driver.node.publish.healthboard import HealthBoard

DRIVER = "gpu.dra-driver.io"
NODE = "node-a"


def gpu(i: int) -> Gpu:
    return Gpu(index=i, minor=i, uuid=f"GPU-{i}", product_name="NVIDIA H100", brand="Nvidia", architecture="Hopper",
               cuda_compute_capability="9.0", driver_version="550.54.15", cuda_driver_version="12.4",
               memory_bytes=80 * 2**30, multiprocessors=132, pci=PciInfo(f"0000:{i + 10:02x}:00.0", None, 0))


class Reader:
    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}

    def get(self, res: Resource, name: str, *, namespace: str | None = None,
            meanwhile: Callable[[], object] | None = None) -> dict[str, Any]:
        if meanwhile is not None:
            meanwhile()
        try:
            return json.loads(json.dumps(self.claims[(namespace, name)]))
        except KeyError:
            raise ApiError(404, "NotFound", name) from None

    def add(self, name: str, results: list[dict[str, Any]]) -> ClaimRef:
        uid = str(uuid.uuid4())
        self.claims[("ns", name)] = {
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "status": {"allocation": {"devices": {"results": [
                {"driver": DRIVER, "pool": NODE, **r} for r in results]}}},
        }
        return ClaimRef(uid, "ns", name)


class Scripted:
    """Answers the first claim with a device and a share ID, the others with an error; records the calls."""

    def __init__(self) -> None:
        self.calls: list[list[ClaimRef]] = []

    def prepare(self, claims: Iterable[ClaimRef]) -> dict[str, PrepareOutcome]:
        claims = list(claims)
        self.calls.append(claims)
        first, *rest = claims
        return {first.uid: PrepareOutcome(devices=(ResponseDevice(("r",), NODE, "gpu-0", ("a/b=c",), "s1"),)),
                **{c.uid: PrepareOutcome(error=f"no {c.name}") for c in rest}}

    def unprepare(self, claims: Iterable[ClaimRef]) -> dict[str, str | None]:
        claims = list(claims)
        self.calls.append(claims)
        return {c.uid: f"kept {c.name}" for c in claims}


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes: pytest's tmp_path can be too long.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dra-", dir="/tmp") as d:
        yield Path(d)


class Plugin:
    def __init__(self, root: Path, handler: Any = None, **kw: Any) -> None:
        self.root = root
        self.reader = Reader()
        self.devices = {"gpu-0": AllocatableDevice("gpu-0", gpu(0)), "gpu-1": AllocatableDevice("gpu-1", gpu(1))}
        self.state = DeviceState(
            node_name=NODE, driver_name=DRIVER, devices=self.devices, cdi=CdiSpecs(root / "cdi", DRIVER),
            checkpoint=CheckpointStore(root / "state", NODE, DRIVER, boot_id="b"), api=self.reader,
        )
        self.dra_sock = root / "plugins" / DRIVER / "dra.sock"
        self.reg_sock = root / "registry" / f"{DRIVER}-reg.sock"
        self.board = kw.pop("health", None) or HealthBoard(self.devices)
        self.servers = PluginServers(driver_name=DRIVER, node_name=NODE, dra_socket=self.dra_sock,
                                     registration_socket=self.reg_sock, handler=handler or self.state,
                                     health=self.board, **kw)
        self.channels: list[grpc.Channel] = []

    def channel(self, path: Path) -> grpc.Channel:
        ch = grpc.insecure_channel(f"unix:{path}")
        self.channels.append(ch)
        return ch

    def v1(self) -> Any:
        return v1_grpc.DRAPluginStub(self.channel(self.dra_sock))

    def v1beta1(self) -> Any:
        return v1beta1_grpc.DRAPluginStub(self.channel(self.dra_sock))

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        self.servers.stop(0)
        self.state.close()


@pytest.fixture
def plugin(short_tmp: Path) -> Iterator[Plugin]:
    p = Plugin(short_tmp)
    p.servers.start()
    yield p
    p.close()


def make_plugin(root: Path, **kw: Any) -> Plugin:
    return Plugin(root, **kw)


class TestRegistration:
    def test_get_info(self, plugin: Plugin) -> None:
        stub = reg_grpc.RegistrationStub(plugin.channel(plugin.reg_sock))
        info = stub.GetInfo(reg.InfoRequest(), timeout=5)
        assert info.type == "DRAPlugin"
        assert info.name == DRIVER
        assert info.endpoint == str(plugin.dra_sock) and os.path.isabs(info.endpoint)
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                                                 "v1alpha1.DRAResourceHealth"]
        assert tuple(info.supported_versions) == SUPPORTED_VERSIONS

    def test_notify(self, short_tmp: Path) -> None:
        seen: list[tuple[bool, str]] = []
        p = make_plugin(short_tmp, on_registration=lambda ok, err: seen.append((ok, err)))
        p.servers.start()
        try:
            stub = reg_grpc.RegistrationStub(p.channel(p.reg_sock))
            stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=5)
            assert p.servers.registered.is_set()
            stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=False, error="bad"), timeout=5)
            assert not p.servers.registered.is_set()
            assert seen == [(True, ""), (False, "bad")]
        finally:
            p.close()


SHARE = "5f0c2b7e-9d3a-4c61-8e2f-0a1b2c3d4e5f"


class TestDra:
    def test_v1_round_trip(self, plugin: Plugin) -> None:
        a = plugin.reader.add("a", [{"request": "gpu/big", "device": "gpu-0", "shareID": SHARE}])
        missing = ClaimRef(str(uuid.uuid4()), "ns", "missing")
        stub = plugin.v1()
        resp = stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[
            v1.Claim(namespace=a.namespace, uid=a.uid, name=a.name),
            v1.Claim(namespace=a.namespace, uid=a.uid, name=a.name),  # duplicate
            v1.Claim(namespace="ns", uid=missing.uid, name="missing"),
        ]), timeout=10)
        assert set(resp.claims) == {a.uid, missing.uid}
        ok = resp.claims[a.uid]
        assert ok.error == ""
        [dev] = ok.devices
        assert list(dev.request_names) == ["gpu"]
        assert dev.pool_name == NODE and dev.device_name == "gpu-0"
        assert list(dev.cdi_device_ids) == [f"k8s.{DRIVER}/claim={a.uid}-gpu-0-{SHARE}"]
        assert dev.HasField("share_id") and dev.share_id == SHARE
        assert "not found" in resp.claims[missing.uid].error
        assert (plugin.root / "cdi" / f"k8s.{DRIVER}-claim_{a.uid}.json").exists()

        un = stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=[
            v1.Claim(namespace="ns", uid=a.uid, name="a"), v1.Claim(namespace="ns", uid=missing.uid, name="m")]),
            timeout=10)
        assert set(un.claims) == {a.uid, missing.uid}
        assert all(c.error == "" for c in un.claims.values())
        assert not (plugin.root / "cdi" / f"k8s.{DRIVER}-claim_{a.uid}.json").exists()

    def test_v1_no_share_id_when_absent(self, plugin: Plugin) -> None:
        a = plugin.reader.add("a", [{"request": "gpu", "device": "gpu-1"}])
        resp = plugin.v1().NodePrepareResources(
            v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace="ns", uid=a.uid, name="a")]), timeout=10)
        assert not resp.claims[a.uid].devices[0].HasField("share_id")

    def test_v1beta1_round_trip(self, plugin: Plugin) -> None:
        a = plugin.reader.add("a", [{"request": "gpu", "device": "gpu-0", "shareID": SHARE}])
        b = plugin.reader.add("b", [{"request": "gpu", "device": "gpu-0"}])
        stub = plugin.v1beta1()
        resp = stub.NodePrepareResources(v1beta1.NodePrepareResourcesRequest(claims=[
            v1beta1.Claim(namespace="ns", uid=a.uid, name="a"), v1beta1.Claim(namespace="ns", uid=b.uid, name="b")]),
            timeout=10)
        dev = resp.claims[a.uid].devices[0]
        assert dev.device_name == "gpu-0" and list(dev.cdi_device_ids) == [f"k8s.{DRIVER}/claim={a.uid}-gpu-0-{SHARE}"]
        assert "share_id" not in v1beta1.Device.DESCRIPTOR.fields_by_name
        assert "already prepared" in resp.claims[b.uid].error
        un = stub.NodeUnprepareResources(v1beta1.NodeUnprepareResourcesRequest(claims=[
            v1beta1.Claim(namespace="ns", uid=a.uid, name="a")]), timeout=10)
        assert un.claims[a.uid].error == ""

    def test_empty_requests(self, plugin: Plugin) -> None:
        assert len(plugin.v1().NodePrepareResources(v1.NodePrepareResourcesRequest(), timeout=5).claims) == 0
        assert len(plugin.v1().NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(), timeout=5).claims) == 0

    def test_a_repeated_claim_reaches_the_handler_once(self, short_tmp: Path) -> None:
        handler = Scripted()
        p = make_plugin(short_tmp, handler=handler)
        p.servers.start()
        try:
            u1, u2 = str(uuid.uuid4()), str(uuid.uuid4())
            claims = [v1.Claim(namespace="ns", uid=u1, name="first"), v1.Claim(namespace="ns", uid=u2, name="b"),
                      v1.Claim(namespace="ns", uid=u1, name="again")]
            resp = p.v1().NodePrepareResources(v1.NodePrepareResourcesRequest(claims=claims), timeout=5)
            un = p.v1().NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=claims), timeout=5)
            assert [[(c.uid, c.name) for c in call] for call in handler.calls] == [[(u1, "first"), (u2, "b")]] * 2
            assert set(resp.claims) == set(un.claims) == {u1, u2}
            assert len(resp.claims[u1].devices) == 1
        finally:
            p.close()

    def test_handler_answers_per_claim(self, short_tmp: Path) -> None:
        p = make_plugin(short_tmp, handler=Scripted())
        p.servers.start()
        try:
            u1, u2 = str(uuid.uuid4()), str(uuid.uuid4())
            claims = [v1.Claim(namespace="ns", uid=u, name=n) for u, n in ((u1, "x"), (u2, "y"))]
            resp = p.v1().NodePrepareResources(v1.NodePrepareResourcesRequest(claims=claims), timeout=5)
            assert resp.claims[u1].devices[0].share_id == "s1" and resp.claims[u1].error == ""
            assert resp.claims[u2].error == "no y" and not resp.claims[u2].devices
            beta = p.v1beta1().NodePrepareResources(v1beta1.NodePrepareResourcesRequest(
                claims=[v1beta1.Claim(namespace="ns", uid=u1, name="x")]), timeout=5)
            assert beta.claims[u1].devices[0].device_name == "gpu-0"
            un = p.v1().NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=claims), timeout=5)
            assert {uid: c.error for uid, c in un.claims.items()} == {u1: "kept x", u2: "kept y"}
        finally:
            p.close()


class TestSockets:
    def test_modes(self, plugin: Plugin) -> None:
        for sock in (plugin.dra_sock, plugin.reg_sock):
            st = os.lstat(sock)
            assert stat.S_ISSOCK(st.st_mode)
            assert stat.S_IMODE(st.st_mode) == 0o600
            assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o750
        # no temporary names left behind, nothing the kubelet would ignore or trip over
        assert sorted(p.name for p in plugin.dra_sock.parent.iterdir()) == ["dra.sock"]
        assert sorted(p.name for p in plugin.reg_sock.parent.iterdir()) == [f"{DRIVER}-reg.sock"]

    def test_group_mode(self, short_tmp: Path) -> None:
        p = make_plugin(short_tmp, socket_group=str(os.getgid()))
        p.servers.start()
        try:
            st = os.lstat(p.dra_sock)
            assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid()
        finally:
            p.close()

    def test_unknown_group(self, short_tmp: Path) -> None:
        p = make_plugin(short_tmp, socket_group="no-such-group-hopefully")
        with pytest.raises(ValueError, match="does not exist"):
            p.servers.start()
        p.state.close()
        assert not p.dra_sock.exists()

    def test_stale_socket_replaced(self, short_tmp: Path) -> None:
        p = make_plugin(short_tmp)
        p.dra_sock.parent.mkdir(parents=True)
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(p.dra_sock))
        stale.close()  # nobody listens: stale
        old_ino = os.lstat(p.dra_sock).st_ino
        p.servers.start()
        try:
            assert os.lstat(p.dra_sock).st_ino != old_ino
            assert len(p.v1().NodePrepareResources(v1.NodePrepareResourcesRequest(), timeout=5).claims) == 0
        finally:
            p.close()

    def test_refuses_to_replace_a_file(self, short_tmp: Path) -> None:
        p = make_plugin(short_tmp)
        p.dra_sock.parent.mkdir(parents=True)
        p.dra_sock.write_text("not a socket")
        with pytest.raises(ValueError, match="not a socket"):
            p.servers.start()
        p.state.close()
        assert p.dra_sock.read_text() == "not a socket"

    def test_stop_removes_own_sockets(self, short_tmp: Path) -> None:
        p = make_plugin(short_tmp)
        p.servers.start()
        p.close()
        assert not p.dra_sock.exists() and not p.reg_sock.exists()

    def test_stop_leaves_a_newer_instances_socket(self, short_tmp: Path) -> None:
        p = make_plugin(short_tmp)
        p.servers.start()
        newer = socket.socket(socket.AF_UNIX)
        tmp = p.reg_sock.parent / "other.tmp"
        newer.bind(str(tmp))
        newer.listen()
        os.replace(tmp, p.reg_sock)  # another instance took the registration socket over
        try:
            p.close()
            assert p.reg_sock.exists() and stat.S_ISSOCK(os.lstat(p.reg_sock).st_mode)
            assert not p.dra_sock.exists()
        finally:
            newer.close()

    def test_path_too_long(self, short_tmp: Path) -> None:
        p = make_plugin(short_tmp)
        p.servers._dra.path = short_tmp / ("x" * 120) / "dra.sock"
        with pytest.raises(ValueError, match="longer than"):
            p.servers.start()
        p.state.close()


class TestHealth:
    # v1 for the 1.37 kubelet, v1alpha1 for 1.36: the same messages, both served.
    @pytest.mark.parametrize(("pb", "pb_grpc"), [(health_v1, health_v1_grpc), (health, health_grpc)], ids=["v1", "v1alpha1"])
    def test_stream(self, short_tmp: Path, pb: Any, pb_grpc: Any) -> None:
        board = HealthBoard(["gpu-0", "gpu-1"])
        p = make_plugin(short_tmp, health=board, resend_interval=0.3)
        p.servers.start()
        try:
            stub = pb_grpc.DRAResourceHealthStub(p.channel(p.dra_sock))
            stream = stub.NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=10)
            first = next(stream)
            assert {(d.device.pool_name, d.device.device_name, d.health) for d in first.devices} == {
                (NODE, "gpu-0", pb.HEALTHY), (NODE, "gpu-1", pb.HEALTHY)}
            assert all(d.last_updated_time > 0 for d in first.devices)
            t0 = time.monotonic()
            board.update("gpu-1", "Unhealthy", "XID 79")
            second = next(stream)
            assert time.monotonic() - t0 < 0.25  # pushed on change, not on the timer
            by_name = {d.device.device_name: d for d in second.devices}
            assert by_name["gpu-1"].health == pb.UNHEALTHY and by_name["gpu-1"].message == "XID 79"
            assert by_name["gpu-0"].health == pb.HEALTHY
            t0 = time.monotonic()
            third = next(stream)  # no change: re-sent on the timer
            assert 0.15 < time.monotonic() - t0 < 2
            assert len(third.devices) == 2
            stream.cancel()
        finally:
            p.close()

    def test_default_source_all_healthy(self, short_tmp: Path) -> None:
        p = Plugin(short_tmp)
        servers = PluginServers(driver_name=DRIVER, node_name=NODE, dra_socket=short_tmp / "d.sock",
                                registration_socket=short_tmp / "r.sock", handler=p.state,
                                device_names=["gpu-0"])
        servers.start()
        try:
            with grpc.insecure_channel(f"unix:{short_tmp / 'd.sock'}") as ch:
                stream = health_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
                    health.NodeWatchResourcesRequest(), timeout=5)
                msg = next(stream)
                assert [(d.device.device_name, d.health) for d in msg.devices] == [("gpu-0", health.HEALTHY)]
                stream.cancel()
        finally:
            servers.stop(0)
            p.state.close()

    def test_stop_ends_stream(self, short_tmp: Path) -> None:
        p = make_plugin(short_tmp, resend_interval=30)
        p.servers.start()
        stub = health_grpc.DRAResourceHealthStub(p.channel(p.dra_sock))
        stream = stub.NodeWatchResources(health.NodeWatchResourcesRequest(), timeout=10)
        next(stream)
        t0 = time.monotonic()
        p.servers.stop(1)
        assert time.monotonic() - t0 < 3
        with pytest.raises((grpc.RpcError, StopIteration)):
            next(stream)
        p.state.close()

    def test_board_rejects_bad_health(self) -> None:
        with pytest.raises(ValueError):
            HealthBoard(["a"]).update("a", "Sick")
        b = HealthBoard(["a"])
        v, _ = b.snapshot()
        b.update("a", "Healthy")  # no change: no version bump
        assert b.snapshot()[0] == v
        b.set_devices(["a", "b"])
        assert [r.device_name for r in b.snapshot()[1]] == ["a", "b"]


class Slow:
    """Prepares take ``delay`` seconds; ``started`` is set when one is in flight."""

    def __init__(self, delay: float) -> None:
        import threading

        self.delay = delay
        self.started = threading.Event()

    def prepare(self, claims: Iterable[ClaimRef]) -> dict[str, PrepareOutcome]:
        self.started.set()
        time.sleep(self.delay)
        return {c.uid: PrepareOutcome(devices=(ResponseDevice(("gpu",), NODE, "gpu-0", ("k8s.x/claim=a",)),))
                for c in claims}

    def unprepare(self, claims: Iterable[ClaimRef]) -> dict[str, str | None]:
        return {}


class TestShutdown:
    def test_stop_deregisters_first_then_finishes_calls_in_flight(self, short_tmp: Path) -> None:
        import threading

        slow = Slow(1.0)
        p = make_plugin(short_tmp, handler=slow)
        p.servers.start()
        other = p.reg_sock.with_name(f"{DRIVER}-0f0f0f0f-0000-4000-8000-000000000001-reg.sock")
        sibling = socket.socket(socket.AF_UNIX)
        sibling.bind(str(other))  # another instance's, in a rolling update
        answers: list[Any] = []
        request = v1.NodePrepareResourcesRequest(claims=[v1.Claim(uid="a", namespace="ns", name="c")])
        call = threading.Thread(target=lambda: answers.append(p.v1().NodePrepareResources(request, timeout=10)))
        call.start()
        assert slow.started.wait(5)
        stopped = time.monotonic()
        stopping = threading.Thread(target=p.servers.stop, args=(10.0,))
        stopping.start()
        deadline = time.monotonic() + 2
        while p.reg_sock.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not p.reg_sock.exists() and call.is_alive(), "deregistered while the call is still running"
        call.join(timeout=10)
        stopping.join(timeout=10)
        assert time.monotonic() - stopped < 5
        assert answers and answers[0].claims["a"].devices[0].device_name == "gpu-0"
        assert not p.dra_sock.exists()
        assert other.exists(), "another instance's socket is never ours to remove"
        with pytest.raises(grpc.RpcError):
            p.v1().NodePrepareResources(request, timeout=1)
        sibling.close()
        p.close()
