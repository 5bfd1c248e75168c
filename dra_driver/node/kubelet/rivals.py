"""Another kubelet plugin of this driver's name on this node, looked for before this one starts.

Under ``--api-profile nvidia`` this driver takes NVIDIA's driver name, ``gpu.nvidia.com``, so on a
node where NVIDIA's own plugin still runs the two would publish the same pool and hand out the
same GPUs: the plugin refuses to start there (exit 1, one line naming what it found). It looks at
two things:

* the kubelet's registration directory: a socket ``<driver>-reg.sock`` or ``<driver>-*-reg.sock``
  (the Go helper's names, with rolling updates) that answers GetInfo as a DRA plugin of this driver,
  and is not this driver's: this driver's instances leave the name of theirs in
  ``<state dir>/instances/`` (NVIDIA's plugin never writes there; its state directory is the one
  above), so a sibling pod of a rolling update is not taken for a rival;
* the API server: a ResourceSlice of this driver for this node that no instance of this driver
  wrote (none of its ``managedFields`` is this driver's plugin's, whose writes the API server names
  after its user agent, ``dra-driver-plugin``). The kubelet removes a plugin's slices once the plugin is gone,
  so one that stays is a plugin that runs.

Only a start-up check: a rival installed later is not noticed, which is why the docs say to remove
NVIDIA's driver from a node before this one goes there. Under this driver's own profile the check
is not made (nothing else publishes its name).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from dra_driver._proto.pluginregistration import api_pb2 as reg_pb2
from dra_driver._proto.pluginregistration import api_pb2_grpc as reg_grpc
from dra_driver.flags import SettingsError
from dra_driver.k8s.client import SLICES, ApiError, KubeApi
from dra_driver.k8s.objects import as_list, as_mapping, as_str, meta
from dra_driver.logs import Logger

PLUGIN_USER_AGENT = "dra-driver-plugin"
"""The node plugin's user agent, which the API server records as the manager of the plugin's writes
(``managedFields[].manager``: the user agent up to its first ``/``)."""
INSTANCES_DIR = "instances"
"""In the state directory: one empty file per live instance, named after its registration socket."""
GETINFO_TIMEOUT = 1.0


class RivalPluginError(SettingsError):
    """Another plugin of this driver's name runs on this node; the plugin does not start."""


@dataclass(frozen=True)
class PluginInfo:
    type: str
    name: str
    endpoint: str


def candidate_sockets(names: Iterable[str], driver: str) -> list[str]:
    """The registration socket names a plugin of ``driver`` can have (``<driver>-reg.sock``, or with
    rolling updates ``<driver>-<pod UID or its hash>-reg.sock``), in order."""
    return sorted(n for n in names if n == f"{driver}-reg.sock" or (n.startswith(f"{driver}-") and n.endswith("-reg.sock")))


def socket_rivals(registry_dir: Path, driver: str, own_socket: Path, ours: Iterable[str],
                  ask: Callable[[Path], PluginInfo | None]) -> list[str]:
    """Each live registration socket of ``driver`` that is not this driver's, in words: this
    instance's own path when something already answers on it, any other unless it is listed in
    ``ours``. ``ask`` is GetInfo (None: nothing answers)."""
    try:
        names = os.listdir(registry_dir)
    except OSError:
        return []
    known = set(ours)
    found = []
    for name in candidate_sockets(names, driver):
        path = registry_dir / name
        if path != own_socket and name in known:
            continue
        info = ask(path)
        if info is not None and info.type == "DRAPlugin" and info.name == driver:
            found.append(f"{path} answers as DRA plugin {driver} (endpoint {info.endpoint})")
    return found


def slice_rivals(slices: Sequence[Mapping[str, Any]], driver: str, node: str) -> list[str]:
    """Each ResourceSlice of ``driver`` for ``node`` that no instance of this driver wrote, in words."""
    found = []
    for body in slices:
        spec = as_mapping(body.get("spec"))
        if as_str(spec.get("driver")) != driver or as_str(spec.get("nodeName")) != node:
            continue
        managers = {as_str(as_mapping(m).get("manager")) for m in as_list(meta(body).get("managedFields"))}
        if PLUGIN_USER_AGENT not in managers:
            writers = ", ".join(sorted(m for m in managers if m)) or "an unknown writer"
            found.append(f"ResourceSlice {as_str(meta(body).get('name'))} of {driver} for node {node} is "
                         f"published by {writers}")
    return found


def rival_message(driver: str, node: str, found: Sequence[str]) -> str:
    return (f"another kubelet plugin of driver {driver} runs on node {node}: {'; '.join(found)}; two plugins of "
            f"one driver name must never both publish: remove NVIDIA's DRA driver from this node first (drain it, "
            f"uninstall its kubelet plugin, then start this one; docs/upgrading.md)")


# --- the edges: GetInfo, the instance files ---------------------------------------------------------


def get_info(path: Path, timeout: float = GETINFO_TIMEOUT) -> PluginInfo | None:
    """GetInfo on a registration socket; None when it is no socket or nothing answers in time."""
    if not path.is_socket():
        return None
    with grpc.insecure_channel(f"unix:{path}") as channel:
        try:
            info = reg_grpc.RegistrationStub(channel).GetInfo(  # type: ignore[no-untyped-call]
                reg_pb2.InfoRequest(), timeout=timeout)
        except grpc.RpcError:
            return None
    return PluginInfo(str(info.type), str(info.name), str(info.endpoint))


def our_instances(state_dir: Path) -> list[str]:
    try:
        return os.listdir(state_dir / INSTANCES_DIR)
    except OSError:
        return []


def mark_instance(state_dir: Path, socket: Path) -> Path:
    """Lists this instance's registration socket as this driver's (mode 0600, in a 0700 directory),
    and forgets those of instances whose socket is gone (killed before they could)."""
    directory = state_dir / INSTANCES_DIR
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in our_instances(state_dir):
        if name != socket.name and not (socket.parent / name).exists():
            (directory / name).unlink(missing_ok=True)
    marker = directory / socket.name
    marker.touch(mode=0o600, exist_ok=True)
    return marker


def refuse_beside_rivals(api: KubeApi, *, driver: str, node: str, registry_dir: Path, own_socket: Path,
                         state_dir: Path, log: Logger) -> None:
    """RivalPluginError when another plugin of ``driver`` runs on ``node`` (the module's two looks);
    a failed slice list is logged and the socket look alone decides."""
    found = socket_rivals(registry_dir, driver, own_socket, our_instances(state_dir), get_info)
    try:
        slices = api.list(SLICES, field_selector=f"spec.nodeName={node},spec.driver={driver}").items
    except ApiError as exc:
        log.warning("cannot read this node's ResourceSlices to look for another plugin of this driver",
                    error=str(exc))
        slices = []
    found += slice_rivals(slices, driver, node)
    if found:
        raise RivalPluginError(rival_message(driver, node, found))
