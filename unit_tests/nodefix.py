"""The node plugin's prepare helpers: GPUs, a fake backend and claim reader, claims, and an Env
that wires a DeviceState over a temporary state directory (shared by the prepare, CDI, metadata,
health and fuzz tests; the ``env`` fixture is in unit_tests/node/conftest.py)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver import CONFIG_API_VERSION
from dra_driver.k8s.client import ApiError, Resource
from dra_driver.node.describe.devices import AllocatableDevice
from dra_driver.node.discovery.model import Gpu, MigDevice, MigPlacement, MigProfile, PciInfo
from dra_driver.node.prepare.calls import ClaimRef
from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.checkpoint import CheckpointStore
from dra_driver.node.prepare.gpupolicy import GpuPolicyError
from dra_driver.node.prepare.mps import Defaults, MpsDaemons, MpsSupervisor, daemon_dir
from dra_driver.node.prepare.state import DeviceState

DRIVER = "gpu.dra-driver.io"
NODE = "node-a"

# --- GPUs ------------------------------------------------------------------------------------

PROFILE_1G = MigProfile("1g.10gb", 10 * 2**30, 16, 1, 1, (MigPlacement(0, 1), MigPlacement(1, 1)))
PROFILE_2G = MigProfile("2g.20gb", 20 * 2**30, 32, 2, 2, (MigPlacement(0, 2),))


def make_gpu(i: int, **kw: Any) -> Gpu:
    return Gpu(index=i, minor=i, uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", product_name="NVIDIA H100",
               brand="Nvidia", architecture="Hopper", cuda_compute_capability="9.0", driver_version="550.54.15",
               cuda_driver_version="12.4", memory_bytes=80 * 2**30, multiprocessors=132,
               pci=PciInfo(f"0000:{i + 10:02x}:00.0", "pci0000:00", 0), **kw)


def static_mig(parent: Gpu, n: int) -> MigDevice:
    return MigDevice(uuid=f"MIG-{parent.index}-{n}", profile="1g.10gb", parent_uuid=parent.uuid,
                     memory_bytes=10 * 2**30, multiprocessors=16, gpu_instance_id=n + 7, compute_instance_id=0,
                     placement=MigPlacement(n, 1))


def build_devices() -> dict[str, AllocatableDevice]:
    g0, g1 = make_gpu(0), make_gpu(1)
    g2 = make_gpu(2, mig_capable=True, mig_enabled=True)
    g2 = Gpu(**{**g2.__dict__, "mig_devices": (static_mig(g2, 0), static_mig(g2, 1))})
    g3 = make_gpu(3, mig_capable=True, mig_profiles=(PROFILE_1G, PROFILE_2G))
    devs = [
        AllocatableDevice("gpu-0", g0),
        AllocatableDevice("gpu-1", g1),
        AllocatableDevice("gpu-2", g2),
        AllocatableDevice("gpu-2-mig-0", g2, mig=g2.mig_devices[0]),
        AllocatableDevice("gpu-2-mig-1", g2, mig=g2.mig_devices[1]),
        AllocatableDevice("gpu-3", g3),
        AllocatableDevice("gpu-3-1g-0", g3, mig_profile=PROFILE_1G, placement=MigPlacement(0, 1)),
        AllocatableDevice("gpu-3-1g-1", g3, mig_profile=PROFILE_1G, placement=MigPlacement(1, 1)),
        AllocatableDevice("gpu-3-2g-0", g3, mig_profile=PROFILE_2G, placement=MigPlacement(0, 2)),
    ]
    return {d.name: d for d in devs}


class FakeBackend:
    name = "fake"

    def __init__(self) -> None:
        self.live: dict[tuple[str, str, int], MigDevice] = {}
        self.created: list[str] = []
        self.destroyed: list[str] = []
        self.counter = 0

    def discover(self) -> list[Gpu]:
        return []

    def create_mig_instance(self, gpu: Gpu, profile: MigProfile, placement: MigPlacement) -> MigDevice:
        key = (gpu.uuid, profile.name, placement.start)
        if key not in self.live:
            self.counter += 1
            self.live[key] = MigDevice(
                uuid=f"MIG-dyn-{self.counter}", profile=profile.name, parent_uuid=gpu.uuid,
                memory_bytes=profile.memory_bytes, multiprocessors=profile.multiprocessors,
                gpu_instance_id=placement.start + 1, compute_instance_id=0, placement=placement)
            self.created.append(self.live[key].uuid)
        return self.live[key]

    def destroy_mig_instance(self, mig: MigDevice) -> None:
        for key, value in list(self.live.items()):
            if value.uuid == mig.uuid:
                del self.live[key]
                self.destroyed.append(mig.uuid)


class FakeGpuControl:
    """The GPUs' compute policy as the driver's nvidia-smi would hold it, with every call made."""

    def __init__(self) -> None:
        self.modes: dict[str, str] = {}
        self.time_slices: dict[str, int] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.fail: dict[str, str] = {}
        """Call name (``set_time_slice``, ...) -> the message it fails with."""

    def _call(self, name: str, gpu: str, arg: str) -> None:
        self.calls.append((name, gpu, arg))
        if name in self.fail:
            from dra_driver.node.prepare.gpupolicy import GpuPolicyError
            raise GpuPolicyError(self.fail[name])

    def compute_mode(self, gpu_uuid: str) -> str:
        self._call("compute_mode", gpu_uuid, "")
        return self.modes.get(gpu_uuid, "Default")

    def set_compute_mode(self, gpu_uuid: str, mode: str) -> None:
        self._call("set_compute_mode", gpu_uuid, mode)
        self.modes[gpu_uuid] = {"DEFAULT": "Default"}.get(mode, mode)

    def set_time_slice(self, gpu_uuid: str, value: int) -> None:
        self._call("set_time_slice", gpu_uuid, str(value))
        self.time_slices[gpu_uuid] = value

    def sets(self) -> list[tuple[str, str]]:
        """The time-slices set, in order: (GPU, value)."""
        return [(gpu, arg) for name, gpu, arg in self.calls if name == "set_time_slice"]


@dataclass
class FakeReader:
    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    delay: float = 0.0
    calls: int = 0
    errors: dict[tuple[str, str], Exception] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    while_reading: Callable[[str], object] | None = None
    """Called with the claim's name after the caller's ``meanwhile``: what happens while the answer travels."""

    def get(self, res: Resource, name: str, *, namespace: str | None = None,
            meanwhile: Callable[[], object] | None = None) -> dict[str, Any]:
        if meanwhile is not None:
            meanwhile()
        if self.while_reading is not None:
            self.while_reading(name)
        with self.lock:
            self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        if (namespace, name) in self.errors:
            raise self.errors[(namespace, name)]
        try:
            return json.loads(json.dumps(self.claims[(namespace, name)]))
        except KeyError:
            raise ApiError(404, "NotFound", f"{namespace}/{name}") from None

    def add(self, claim: dict[str, Any]) -> ClaimRef:
        m = claim["metadata"]
        self.claims[(m["namespace"], m["name"])] = claim
        return ClaimRef(m["uid"], m["namespace"], m["name"])


def gpu_config(sharing: dict[str, Any] | None = None, requests: list[str] | None = None,
               source: str = "FromClaim", driver: str = DRIVER) -> dict[str, Any]:
    params: dict[str, Any] = {"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig"}
    if sharing is not None:
        params["sharing"] = sharing
    return {"source": source, "requests": requests or [], "opaque": {"driver": driver, "parameters": params}}


def nvidia_config(sharing: dict[str, Any] | None = None, requests: list[str] | None = None,
                  kind: str = "GpuConfig", driver: str = DRIVER) -> dict[str, Any]:
    """An entry in NVIDIA's API (resource.nvidia.com/v1beta1), as their driver's claims carry it."""
    params: dict[str, Any] = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind}
    if sharing is not None:
        params["sharing"] = sharing
    return {"source": "FromClaim", "requests": requests or [], "opaque": {"driver": driver, "parameters": params}}


TS = {"strategy": "TimeSlicing"}
MPS = {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}}


def make_claim(name: str, results: list[dict[str, Any] | tuple[str, str]], *, ns: str = "default",
               uid: str | None = None, config: list[dict[str, Any]] | None = None, node: str | None = NODE,
               allocated: bool = True) -> dict[str, Any]:
    res = []
    for r in results:
        if isinstance(r, tuple):
            r = {"request": r[0], "device": r[1]}
        res.append({"driver": DRIVER, "pool": NODE, **r})
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": uid or str(uuid.uuid4())},
        "spec": {}, "status": {},
    }
    if allocated:
        alloc: dict[str, Any] = {"devices": {"results": res, "config": config or []}}
        if node is not None:
            alloc["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
        claim["status"]["allocation"] = alloc
    return claim


class Env:
    def __init__(self, tmp_path: Path, boot: str = "boot-1") -> None:
        self.tmp = tmp_path
        self.reader = FakeReader()
        self.backend = FakeBackend()
        self.gpus = FakeGpuControl()
        self.devices = build_devices()
        self.boot = boot
        self.instance: str | None = None
        """The pod UID the states record as the preparing instance."""
        self.proc = tmp_path / "proc"  # no mig-minors table: the formula is used
        self.state = self.new_state()

    @property
    def cdi_root(self) -> Path:
        return self.tmp / "cdi"

    def new_state(self, boot: str | None = None) -> DeviceState:
        if boot is not None:
            self.boot = boot
        return DeviceState(
            node_name=NODE, driver_name=DRIVER, devices=self.devices, cdi=self.new_cdi(),
            checkpoint=CheckpointStore(self.tmp / "state", NODE, DRIVER, boot_id=self.boot, instance=self.instance),
            api=self.reader, backend=self.backend, proc_root=self.proc, gpu_control=self.gpus, **self.state_options(),
        )

    # Hooks for test beds that vary one part of the state (metadata, driver edits, shares).
    def new_cdi(self) -> CdiSpecs:
        return CdiSpecs(self.cdi_root, DRIVER, self.tmp / "devroot", node_name=NODE)

    def state_options(self) -> dict[str, Any]:
        return {}

    def spec(self, uid: str) -> dict[str, Any]:
        return json.loads((self.cdi_root / f"k8s.{DRIVER}-claim_{uid}.json").read_text())

    def spec_exists(self, uid: str) -> bool:
        return (self.cdi_root / f"k8s.{DRIVER}-claim_{uid}.json").exists()

    def checkpoint(self) -> dict[str, Any]:
        """What the file holds, by UID, as another process reading it sees it."""
        store = CheckpointStore(self.tmp / "state", NODE, DRIVER, boot_id="")
        return {uid: entry.to_dict() for uid, entry in store.load().items()}

    def prepare_one(self, claim: dict[str, Any]) -> Any:
        ref = self.reader.add(claim)
        return self.state.prepare([ref])[ref.uid]


def env_of(edits: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in edits.get("env", []))


# --- happy path -------------------------------------------------------------------------------


# --- MPS control daemons ----------------------------------------------------------------------

GPU0_UUID = "GPU-00000000-0000-0000-0000-000000000000"


class FakeDaemons(MpsDaemons):
    def __init__(self, state_dir: Path) -> None:
        super().__init__(Path("/nonexistent"), state_dir, control=None)  # type: ignore[arg-type]
        self.live: dict[str, Defaults] = {}
        self.starts: list[str] = []
        self.stops: list[str] = []
        self.fail: str | None = None

    def running(self, gpu_uuid: str) -> bool:
        return gpu_uuid in self.live

    def ensure(self, gpu_uuid: str, defaults: Defaults) -> str:
        if self.fail:
            raise GpuPolicyError(self.fail)
        was = gpu_uuid in self.live
        daemon_dir(self.state_dir, gpu_uuid).mkdir(parents=True, exist_ok=True)
        self.live[gpu_uuid] = defaults
        if not was:
            self.starts.append(gpu_uuid)
        return "adopted" if was else "started"

    def stop(self, gpu_uuid: str) -> bool:
        home = daemon_dir(self.state_dir, gpu_uuid)
        if home.exists():
            home.rmdir()
        if gpu_uuid in self.live:
            del self.live[gpu_uuid]
            self.stops.append(gpu_uuid)
            return True
        return False


class MpsEnv(Env):
    def __init__(self, tmp_path: Path) -> None:
        self.daemons = FakeDaemons(tmp_path / "state")
        super().__init__(tmp_path)

    def new_cdi(self) -> CdiSpecs:
        return CdiSpecs(self.cdi_root, "gpu.dra-driver.io", self.tmp / "devroot", node_name="node-a",
                        mps_state_dir=self.tmp / "state")

    def state_options(self) -> dict[str, Any]:
        return {"mps": MpsSupervisor(self.daemons)}


def share(device: str, memory: str) -> dict[str, Any]:
    return {"request": "gpu", "device": device, "shareID": str(uuid.uuid4()), "consumedCapacity": {"memory": memory}}
