"""CDI specs: one transient spec file per prepared claim.

* file: ``<cdi_root>/k8s.<driver>-claim_<claimUID>.json`` (mode 0644, written atomically)
* kind: ``k8s.<driver>/claim``
* device names: ``<claimUID>-<deviceName>``, ``<claimUID>-<deviceName>-<shareID>`` for a consumable
  share; fully-qualified ID ``k8s.<driver>/claim=<name>``
* ``cdiVersion``: the lowest version the content needs (0.5.0 once ``hostPath`` is used or a device
  name starts with a digit, else 0.3.0)

Spec-level edits (applied once when any device of the claim is injected): the control nodes
``/dev/nvidiactl``, ``/dev/nvidia-uvm``, ``/dev/nvidia-uvm-tools``, ``NVIDIA_VISIBLE_DEVICES`` with
the claim's UUIDs, MPS client limits, and ``DRA_GPU_CLAIM*`` variables. Device-level edits: the GPU
node ``/dev/nvidiaN``, MIG capability nodes ``/dev/nvidia-caps/nvidia-capN`` and the
``DRA_GPU_<i>_*`` variables describing that device (for a share: its ID, memory and compute
share). With a fake dev root (simulated GPUs) every node gets ``hostPath`` under the dev root
while ``path`` stays ``/dev/...``.

With the NVML backend the driver's own edits from the NVIDIA Container Toolkit (libraries, binaries,
firmware, hooks: :mod:`dra_driver.node.prepare.toolkit`) join the spec-level edits.

Every name that ends up in a path is validated first (claim UID, driver name).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.gpuconfig import EXCLUSIVE, SharingConfig, Strategy
from dra_driver.k8s.names import is_dns_label, is_driver_name
from dra_driver.k8s.quantity import format_canonical
from dra_driver.node.fileio import atomic_write, ensure_dir, remove_stale_temp_files
from dra_driver.node.metrics import METRICS
from dra_driver.node.prepare.toolkit import merge_edits

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_SPEC_FILE = re.compile(r"k8s\.(?P<driver>.+)-claim_(?P<uid>[0-9a-f-]{36})\.json")

SPEC_MODE = 0o644
DIR_MODE = 0o755
DERIVED_FILES_DURABLE = False
"""Whether claims' CDI specs and device metadata files are fsynced. They are not: they are derived
from the checkpoint, and a power loss, the one thing that can tear them, ends in a new boot that
re-writes every prepared claim's files from it before serving (:mod:`dra_driver.node.prepare.state`,
"Durability"; ``test_power_loss_*`` in the unit tests)."""
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


class CdiError(ValueError):
    """Invalid input for a CDI spec (never a file-system error: those are OSError)."""


def validate_claim_uid(uid: str) -> str:
    if not isinstance(uid, str) or not _UUID.fullmatch(uid):
        raise CdiError(f"claim UID {uid!r} is not a lower-case RFC 4122 UUID")
    return uid


def validate_share_id(share_id: Any) -> str:
    if not isinstance(share_id, str) or not _UUID.fullmatch(share_id):
        raise CdiError(f"shareID {share_id!r} is not a lower-case RFC 4122 UUID")
    return share_id


def validate_driver_name(driver: str) -> str:
    # ASCII as well: the API server lower-cases a driver name before checking it, which lets two
    # non-ASCII letters through, and a CDI vendor name is ASCII.
    if not is_driver_name(driver) or not driver.isascii():
        raise CdiError(f"driver name {driver!r} is not a DNS subdomain of at most 63 characters")
    return driver


def validate_device_name(name: str) -> str:
    if not is_dns_label(name):
        raise CdiError(f"device name {name!r} is not a DNS label")
    return name


# --- spec content -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimDevice:
    """What the spec needs to know about one prepared device of a claim."""

    device_name: str
    request: str
    """Full request name of the allocation result (``req`` or ``req/sub``)."""
    uuid: str
    """GPU UUID, or MIG instance UUID."""
    gpu_minor: int
    """N of /dev/nvidiaN (the parent GPU for MIG)."""
    mig_caps: tuple[int, ...] = ()
    sharing: SharingConfig = EXCLUSIVE
    admin_access: bool = False
    share_id: str | None = None
    memory_share_bytes: int | None = None
    """A share's consumed memory."""
    compute_share_percent: int | None = None
    """A share's consumed compute, percent of the device."""


def spec_bytes(spec: dict[str, Any]) -> bytes:
    """A spec file's content: compact JSON, which json's C encoder writes (an indented dump goes
    through its pure-Python encoder, several times slower on the prepare path)."""
    return json.dumps(spec, separators=(",", ":")).encode() + b"\n"


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def minimum_cdi_version(spec: dict[str, Any]) -> str:
    """The lowest ``cdiVersion`` whose features cover what ``spec`` uses (of what we emit)."""
    version = "0.3.0"

    def need(v: str) -> None:
        nonlocal version
        if _version_tuple(v) > _version_tuple(version):
            version = v

    edits = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec.get("devices", [])]
    for e in edits:
        if any("hostPath" in n for n in e.get("deviceNodes", [])):
            need("0.5.0")
        if any("type" in m for m in e.get("mounts", [])):
            need("0.4.0")
        if "intelRdt" in e or "additionalGids" in e:
            need("0.7.0")
        if "netDevices" in e:
            need("1.1.0")
    for d in spec.get("devices", []):
        if d["name"][:1].isdigit():
            need("0.5.0")
        if "annotations" in d:
            need("0.6.0")
    if "annotations" in spec or "." in spec["kind"].split("/", 1)[1]:
        need("0.6.0")
    return version


def share_env(prefix: str, dev: ClaimDevice) -> list[str]:
    """What a container is told about its share of a device; a variable is absent when the share
    consumed none of it."""
    env = []
    if dev.memory_share_bytes is not None:
        env += [f"{prefix}MEMORY_SHARE={format_canonical(dev.memory_share_bytes)}",
                f"{prefix}MEMORY_SHARE_BYTES={dev.memory_share_bytes}"]
    if dev.compute_share_percent is not None:
        env.append(f"{prefix}COMPUTE_SHARE_PERCENT={dev.compute_share_percent}")
    return env


def _mps_limit_text(n_bytes: int) -> str:
    mib = max(1, n_bytes // 2**20)
    return f"{mib}M"


class CdiSpecs:
    """Writes, deletes and lists the per-claim CDI specs of one driver in one directory."""

    def __init__(self, cdi_root: Path, driver_name: str, dev_root: Path = Path("/"),
                 *, node_name: str = "", driver_edits: Callable[[], dict[str, Any]] | None = None) -> None:
        self.cdi_root = Path(cdi_root)
        self.driver_name = validate_driver_name(driver_name)
        self.vendor = f"k8s.{driver_name}"
        self.kind = f"{self.vendor}/claim"
        self.dev_root = Path(dev_root)
        self.node_name = node_name
        self._fake_dev_root = self.dev_root.resolve() != Path("/")
        # The driver's libraries, binaries and hooks (dra_driver.node.prepare.toolkit); raises when the driver
        # is missing, so that no spec starts a container without it.
        self._driver_edits = driver_edits

    # names
    def cdi_device_name(self, claim_uid: str, device_name: str, share_id: str | None = None) -> str:
        """``<claimUID>-<device>``, and ``-<shareID>`` for a share: a claim may hold two shares of one
        device (two requests), and each is its own CDI device."""
        name = f"{validate_claim_uid(claim_uid)}-{validate_device_name(device_name)}"
        return f"{name}-{validate_share_id(share_id)}" if share_id else name

    def cdi_device_id(self, claim_uid: str, device_name: str, share_id: str | None = None) -> str:
        return f"{self.kind}={self.cdi_device_name(claim_uid, device_name, share_id)}"

    def spec_path(self, claim_uid: str) -> Path:
        return self.cdi_root / f"{self.vendor}-claim_{validate_claim_uid(claim_uid)}.json"

    def require_driver(self) -> None:
        """Raise DriverEditsError, naming what is missing, when the driver's edits cannot be had."""
        if self._driver_edits is not None:
            self._driver_edits()

    # content
    def _node(self, name: str) -> dict[str, Any]:
        node: dict[str, Any] = {"path": f"/dev/{name}"}
        if self._fake_dev_root:
            node["hostPath"] = str(self.dev_root / "dev" / name)
        return node

    def build_spec(self, claim_uid: str, namespace: str, name: str, devices: Sequence[ClaimDevice]) -> dict[str, Any]:
        validate_claim_uid(claim_uid)
        if not devices:
            raise CdiError("a CDI spec needs at least one device")
        for value in (namespace, name):
            if "\x00" in value or "\n" in value:
                raise CdiError(f"invalid claim reference {namespace!r}/{name!r}")
        spec_devices: list[dict[str, Any]] = []
        seen: set[str] = set()
        uuids: list[str] = []
        mps_pct: list[int] = []
        mps_mem: dict[int, int] = {}
        names: list[str] = []
        for dev in devices:
            cdi_name = self.cdi_device_name(claim_uid, dev.device_name, dev.share_id)
            if cdi_name in seen:
                continue
            seen.add(cdi_name)
            i = len(names)
            names.append(dev.device_name)
            if dev.uuid not in uuids:
                uuids.append(dev.uuid)
            nodes = [self._node(f"nvidia{int(dev.gpu_minor)}")]
            nodes += [self._node(f"nvidia-caps/nvidia-cap{int(c)}") for c in dev.mig_caps]
            prefix = f"DRA_GPU_{i}_"
            env = [
                f"{prefix}DEVICE={dev.device_name}",
                f"{prefix}REQUEST={dev.request}",
                f"{prefix}UUID={dev.uuid}",
                f"{prefix}SHARING={dev.sharing.describe()}",
            ]
            if dev.admin_access:
                env.append(f"{prefix}ADMIN_ACCESS=true")
            if dev.share_id:
                env.append(f"{prefix}SHARE_ID={dev.share_id}")
                env += share_env(prefix, dev)
            sharing = dev.sharing
            if sharing.strategy is Strategy.TIME_SLICING and sharing.interval is not None:
                env.append(f"{prefix}TIMESLICE_INTERVAL={sharing.interval.value}")
            if sharing.strategy is Strategy.MPS and sharing.mps is not None:
                ordinal = uuids.index(dev.uuid)
                if sharing.mps.default_active_thread_percentage is not None:
                    mps_pct.append(sharing.mps.default_active_thread_percentage)
                    env.append(f"{prefix}MPS_ACTIVE_THREAD_PERCENTAGE={sharing.mps.default_active_thread_percentage}")
                if sharing.mps.default_pinned_device_memory_limit_bytes is not None:
                    limit_bytes = sharing.mps.default_pinned_device_memory_limit_bytes
                    # Two shares of one GPU in one claim: one client, so their limits add up.
                    mps_mem[ordinal] = mps_mem.get(ordinal, 0) + limit_bytes
                    env.append(f"{prefix}MPS_PINNED_DEVICE_MEM_LIMIT={_mps_limit_text(limit_bytes)}")
            spec_devices.append({"name": cdi_name, "containerEdits": {"deviceNodes": nodes, "env": env}})
        claim_env = [
            f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}",
            f"DRA_GPU_DRIVER={self.driver_name}",
            f"DRA_GPU_CLAIM={namespace}/{name}",
            f"DRA_GPU_CLAIM_UID={claim_uid}",
            f"DRA_GPU_COUNT={len(names)}",
            f"DRA_GPU_DEVICES={','.join(names)}",
        ]
        if self.node_name:
            claim_env.append(f"DRA_GPU_NODE={self.node_name}")
        if mps_pct:
            # One value per MPS client: the strictest of the claim's devices.
            claim_env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={min(mps_pct)}")
        if mps_mem:
            limits = ",".join(f"{ordinal}={_mps_limit_text(n)}" for ordinal, n in sorted(mps_mem.items()))
            claim_env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={limits}")
        spec: dict[str, Any] = {
            "cdiVersion": "",
            "kind": self.kind,
            "devices": spec_devices,
            "containerEdits": {
                "deviceNodes": [self._node(n) for n in CONTROL_NODES],
                "env": claim_env,
            },
        }
        if self._driver_edits is not None:
            spec["containerEdits"] = merge_edits(spec["containerEdits"], self._driver_edits())
        spec["cdiVersion"] = minimum_cdi_version(spec)
        return spec

    # files
    def write_claim_spec(self, claim_uid: str, namespace: str, name: str,
                         devices: Sequence[ClaimDevice]) -> list[str]:
        """Write (or replace) the claim's spec; returns the fully-qualified CDI device IDs.

        Raises CdiError for invalid input and OSError (ENOSPC, ...) for write failures.
        """
        spec = self.build_spec(claim_uid, namespace, name, devices)
        data = spec_bytes(spec)
        try:
            ensure_dir(self.cdi_root, DIR_MODE)
            atomic_write(self.spec_path(claim_uid), data, SPEC_MODE, durable=DERIVED_FILES_DURABLE)
        except OSError:
            METRICS.cdi_spec_writes.labels(result="error").inc()
            raise
        METRICS.cdi_spec_writes.labels(result="success").inc()
        return list(dict.fromkeys(self.cdi_device_id(claim_uid, d.device_name, d.share_id) for d in devices))

    def spec_exists(self, claim_uid: str) -> bool:
        return self.spec_path(claim_uid).is_file()

    def delete_claim_spec(self, claim_uid: str) -> bool:
        """Remove the claim's spec; False when there was none."""
        try:
            os.unlink(self.spec_path(claim_uid))
        except FileNotFoundError:
            return False
        return True

    def remove_stale_temp_files(self) -> list[str]:
        """Delete temporary spec files of writes interrupted by a crash (only this driver's names)."""
        # atomic_write names them ".<spec file name>.tmp-<random>".
        prefix = f".{self.vendor}-claim_"
        return remove_stale_temp_files(self.cdi_root, lambda name: name.startswith(prefix))

    def list_claim_specs(self) -> list[str]:
        """Claim UIDs that have a spec of this driver in the directory."""
        try:
            names = os.listdir(self.cdi_root)
        except FileNotFoundError:
            return []
        uids = []
        for entry in names:
            m = _SPEC_FILE.fullmatch(entry)
            if m and m["driver"] == self.driver_name and _UUID.fullmatch(m["uid"]):
                uids.append(m["uid"])
        return sorted(uids)
