"""Container edits for a claim's prepared devices, from their applied config.

Per device: the GPU node ``/dev/nvidiaN`` and the MIG capability nodes
``/dev/nvidia-caps/nvidia-capN``. For the claim: the control nodes and ``DRA_GPU_DRIVER``,
``DRA_GPU_CLAIM``, ``DRA_GPU_CLAIM_UID``, ``DRA_GPU_NODE``. In each view (one per request, and one for
the whole claim of several requests: :mod:`dra_driver.node.prepare.views`), for the view's devices:
``NVIDIA_VISIBLE_DEVICES`` with their UUIDs, ``DRA_GPU_COUNT``, ``DRA_GPU_DEVICES``, the
``DRA_GPU_<i>_*`` variables saying what the container got (device, request, UUID, sharing; for a
share its ID, memory and compute; the time-slice interval and MPS client limits its config sets),
and for MPS devices the one set of MPS client limits for the container. Claims prepared before views
keep the earlier layout: the per-device variables on the devices, the rest on the claim.
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

from dra_driver.gpuconfig import EXCLUSIVE, SharingConfig, Strategy, base_request
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
    """A claim's edits: one entry per distinct (device, share), the ones for the whole claim, and
    the views'."""

    devices: list[DeviceEdits] = field(default_factory=list)
    common: dict[str, Any] = field(default_factory=dict)
    views: dict[str | None, dict[str, Any]] = field(default_factory=dict)
    """By request (None: the whole claim), the edits of its view; none in the earlier layout."""


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


def _distinct(devices: Sequence[ClaimDevice]) -> list[ClaimDevice]:
    """One per (device, share): a device listed twice for one share is prepared once."""
    seen: set[tuple[str, str | None]] = set()
    out = []
    for dev in devices:
        if (dev.device_name, dev.share_id) not in seen:
            seen.add((dev.device_name, dev.share_id))
            out.append(dev)
    return out


@dataclass(frozen=True)
class _ViewEnv:
    """What a container given ``devices`` is told about them: per device, and for them together."""

    per_device: list[list[str]]
    together: list[str]
    mps_client: list[str]

    def all(self) -> list[str]:
        return [*(v for env in self.per_device for v in env), *self.together, *self.mps_client]


def _view_env(devices: Sequence[ClaimDevice]) -> _ViewEnv:
    uuids = list(dict.fromkeys(dev.uuid for dev in devices))
    mps = _Mps()
    per_device = [_device_env(f"DRA_GPU_{i}_", dev, uuids.index(dev.uuid), mps) for i, dev in enumerate(devices)]
    together = [
        f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}",
        f"DRA_GPU_COUNT={len(devices)}",
        f"DRA_GPU_DEVICES={','.join(dev.device_name for dev in devices)}",
    ]
    client = []
    if mps.percents:
        # One value per MPS client: the strictest of the devices.
        client.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={min(mps.percents)}")
    if mps.memory:
        limits = ",".join(f"{ordinal}={_mps_limit_text(n)}" for ordinal, n in sorted(mps.memory.items()))
        client.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={limits}")
    return _ViewEnv(per_device, together, client)


def _device_nodes(dev: ClaimDevice, host_dev: Path | None) -> list[dict[str, Any]]:
    nodes = [device_node(f"nvidia{int(dev.gpu_minor)}", host_dev)]
    return nodes + [device_node(f"nvidia-caps/nvidia-cap{int(c)}", host_dev) for c in dev.mig_caps]


def _names(env: Sequence[str]) -> list[str]:
    return [e.partition("=")[0] for e in env]


def claim_edits(claim_uid: str, claim_ref: str, driver_name: str, node_name: str, devices: Sequence[ClaimDevice],
                host_dev: Path | None, *, per_request: bool = False) -> ClaimEdits:
    """The edits for ``devices`` of the claim ``claim_ref`` (``namespace/name``) on ``node_name``.
    ``per_request``: the environment that describes the devices goes into views
    (:mod:`dra_driver.node.prepare.views`), so that a container given one request of the claim is
    told of that request's devices alone; else (claims prepared before views) each device carries
    its own variables and the claim's spec-wide edits the rest."""
    out = ClaimEdits()
    distinct = _distinct(devices)
    claim_env = [
        f"DRA_GPU_DRIVER={driver_name}",
        f"DRA_GPU_CLAIM={claim_ref}",
        f"DRA_GPU_CLAIM_UID={claim_uid}",
    ]
    if node_name:
        claim_env.append(f"DRA_GPU_NODE={node_name}")
    control = [device_node(n, host_dev) for n in CONTROL_NODES]
    if per_request:
        out.devices = [DeviceEdits(dev, {"deviceNodes": _device_nodes(dev, host_dev)}) for dev in distinct]
        requests = list(dict.fromkeys(base_request(dev.request) for dev in distinct))
        views = {r: _view_env([d for d in distinct if base_request(d.request) == r]).all() for r in requests}
        out.views = {r: {"env": env} for r, env in views.items()}
        if len(requests) > 1:
            whole = _view_env(distinct).all()
            # The whole claim's view comes after every request's: it empties what they set and it does not.
            set_by_requests = dict.fromkeys(n for env in views.values() for n in _names(env))
            whole += [f"{n}=" for n in set_by_requests if n not in set(_names(whole))]
            out.views[None] = {"env": whole}
        out.common = {"deviceNodes": control, "env": claim_env}
        return out
    view = _view_env(distinct)
    for dev, env in zip(distinct, view.per_device, strict=True):
        out.devices.append(DeviceEdits(dev, {"deviceNodes": _device_nodes(dev, host_dev), "env": env}))
    # The client limits ride on the MPS devices' own edits, not the claim's: a container that names
    # another request of the claim (NVIDIA's gpu-test5: one request time-sliced, one under MPS) gets
    # the claim's edits too, and must not become an MPS client. Each MPS device carries the same
    # values, so a container with several gets them once.
    for entry in out.devices:
        if entry.device.sharing.strategy is Strategy.MPS:
            entry.edits["env"] += view.mps_client
    together = view.together
    out.common = {"deviceNodes": control, "env": [together[0], *claim_env[:3], *together[1:], *claim_env[3:]]}
    return out
