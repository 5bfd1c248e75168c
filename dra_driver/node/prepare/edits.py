"""Container edits for a claim's prepared devices, from their applied config.

Per device: the GPU node ``/dev/nvidiaN``, the MIG capability nodes
``/dev/nvidia-caps/nvidia-capN``, and ``DRA_GPU_<i>_*`` variables saying what the container got
(device, request, UUID, sharing; for a share its ID, memory and compute; the time-slice interval
and MPS client limits its config sets), and on each MPS device the claim's one set of MPS client
limits for the container. For the claim: the control nodes, ``NVIDIA_VISIBLE_DEVICES`` with the
claim's UUIDs and ``DRA_GPU_*`` variables.
With a fake dev root (simulated GPUs) every node gets ``hostPath`` under it while ``path`` stays
``/dev/...``.

The CDI module (:mod:`dra_driver.node.prepare.cdi`) names the devices and writes the edits into the
claim's spec file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.gpuconfig import EXCLUSIVE, SharingConfig, Strategy
from dra_driver.k8s.quantity import format_canonical

CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


@dataclass(frozen=True)
class ClaimDevice:
    """What the edits need to know about one prepared device of a claim."""

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
    mps_gpu: str | None = None
    """The GPU whose MPS control daemon the container's clients use (an MPS config on a whole GPU)."""


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


def device_node(name: str, host_dev: Path | None) -> dict[str, Any]:
    """``/dev/<name>``; with ``host_dev`` (a fake dev root's ``dev``) the host path under it."""
    node: dict[str, Any] = {"path": f"/dev/{name}"}
    if host_dev is not None:
        node["hostPath"] = str(host_dev / name)
    return node


@dataclass(frozen=True)
class DeviceEdits:
    device: ClaimDevice
    edits: dict[str, Any]


@dataclass
class ClaimEdits:
    """A claim's edits: one entry per distinct (device, share), and the ones for the whole claim."""

    devices: list[DeviceEdits] = field(default_factory=list)
    common: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Mps:
    """The claim's MPS limits so far: one client per container, so one value each."""

    percents: list[int] = field(default_factory=list)
    memory: dict[int, int] = field(default_factory=dict)
    """Pinned-memory limit by GPU ordinal in ``NVIDIA_VISIBLE_DEVICES``."""


def _device_env(prefix: str, dev: ClaimDevice, ordinal: int, mps: _Mps) -> list[str]:
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
        if sharing.mps.default_active_thread_percentage is not None:
            mps.percents.append(sharing.mps.default_active_thread_percentage)
            env.append(f"{prefix}MPS_ACTIVE_THREAD_PERCENTAGE={sharing.mps.default_active_thread_percentage}")
        if sharing.mps.default_pinned_device_memory_limit_bytes is not None:
            limit_bytes = sharing.mps.default_pinned_device_memory_limit_bytes
            # Two shares of one GPU in one claim: one client, so their limits add up.
            mps.memory[ordinal] = mps.memory.get(ordinal, 0) + limit_bytes
            env.append(f"{prefix}MPS_PINNED_DEVICE_MEM_LIMIT={_mps_limit_text(limit_bytes)}")
    return env


def claim_edits(claim_uid: str, claim_ref: str, driver_name: str, node_name: str, devices: Sequence[ClaimDevice],
                host_dev: Path | None) -> ClaimEdits:
    """The edits for ``devices`` of the claim ``claim_ref`` (``namespace/name``) on ``node_name``."""
    out = ClaimEdits()
    seen: set[tuple[str, str | None]] = set()
    uuids: list[str] = []
    names: list[str] = []
    mps = _Mps()
    for dev in devices:
        if (dev.device_name, dev.share_id) in seen:
            continue
        seen.add((dev.device_name, dev.share_id))
        prefix = f"DRA_GPU_{len(names)}_"
        names.append(dev.device_name)
        if dev.uuid not in uuids:
            uuids.append(dev.uuid)
        nodes = [device_node(f"nvidia{int(dev.gpu_minor)}", host_dev)]
        nodes += [device_node(f"nvidia-caps/nvidia-cap{int(c)}", host_dev) for c in dev.mig_caps]
        env = _device_env(prefix, dev, uuids.index(dev.uuid), mps)
        out.devices.append(DeviceEdits(dev, {"deviceNodes": nodes, "env": env}))
    claim_env = [
        f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}",
        f"DRA_GPU_DRIVER={driver_name}",
        f"DRA_GPU_CLAIM={claim_ref}",
        f"DRA_GPU_CLAIM_UID={claim_uid}",
        f"DRA_GPU_COUNT={len(names)}",
        f"DRA_GPU_DEVICES={','.join(names)}",
    ]
    if node_name:
        claim_env.append(f"DRA_GPU_NODE={node_name}")
    client_env = []
    if mps.percents:
        # One value per MPS client: the strictest of the claim's devices.
        client_env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={min(mps.percents)}")
    if mps.memory:
        limits = ",".join(f"{ordinal}={_mps_limit_text(n)}" for ordinal, n in sorted(mps.memory.items()))
        client_env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={limits}")
    # The client limits ride on the MPS devices' own edits, not the claim's: a container that names
    # another request of the claim (NVIDIA's gpu-test5: one request time-sliced, one under MPS) gets
    # the claim's edits too, and must not become an MPS client. Each MPS device carries the same
    # values, so a container with several gets them once.
    for entry in out.devices:
        if entry.device.sharing.strategy is Strategy.MPS:
            entry.edits["env"] += client_env
    out.common = {"deviceNodes": [device_node(n, host_dev) for n in CONTROL_NODES], "env": claim_env}
    return out
