"""The ResourceSlices our plugin publishes for a simulated node, and a fleet of such nodes.

:func:`published_slices` is the one home of "the slices our plugin publishes for a simulated node":
the benchmarks' fleets (the resolution bench's 100 nodes and the scale bench's thousands), the
informer-memory objects (:mod:`e2e.generators.clusterobjects`) and the unit tests that need a
plugin's slice take them from here.

Every slice is the plugin's own output: the simulated discovery backend
(:mod:`dra_driver.node.discovery.simulated`) over a node profile built from the shipped models
(``dra_driver/profiles``), then :func:`~dra_driver.node.describe.devices.enumerate_devices`,
:func:`~dra_driver.node.describe.devices.describe`, :func:`~dra_driver.node.publish.slices.split_into_slices` and the
create bodies of :func:`~dra_driver.node.publish.slices.plan`, as ``dra-driver kubelet-plugin`` does at start.

Node ``i`` is named :func:`node_name` ``(i)`` (``gpu-node-<i+1>``, as the bed names its nodes) and
has 8 GPUs of one model; models rotate over the fleet (H100 80GB, A100 40GB, L4, T4). Nodes with
dynamic MIG alternate H100 and A100 and publish the full MIG catalogue (counter-set slices and the
device slices that consume them), so such a node has several slices.

The plugin path runs once per (model, dynamic MIG) kind for a template node; each node's slices are
that template with the node name and the GPU UUIDs (derived from the node name, as the simulated
backend derives them) substituted. ``unit_tests/e2e_tools/generators/test_fleet.py`` checks that this equals the
plugin path run for the node itself.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from dra_driver.apiprofile import OWN, ApiProfile
from dra_driver.node.describe.devices import describe, enumerate_devices
from dra_driver.node.describe.shares import DISABLED, ConsumableShares
from dra_driver.node.discovery.profiles import NodeProfile, parse_profile
from dra_driver.node.discovery.simulated import SimulatedBackend, gpu_uuid, mig_uuid
from dra_driver.node.publish.slices import PoolOwner, plan, split_into_slices, validate_pool

DRIVER = "gpu.dra-driver.io"
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class NodeKind:
    model: str
    """Model key in the shipped profile that defines it."""
    profile: str
    """The shipped profile the model's product data comes from."""
    dynamic_mig: bool = False


PLAIN_KINDS = (
    NodeKind("h100-sxm5-80gb", "h100-8x"),
    NodeKind("a100-sxm4-40gb", "a100-mig"),
    NodeKind("l4", "mixed-l4-t4"),
    NodeKind("t4", "mixed-l4-t4"),
)
MIG_KINDS = (
    NodeKind("h100-sxm5-80gb", "h100-8x", dynamic_mig=True),
    NodeKind("a100-sxm4-40gb", "a100-mig", dynamic_mig=True),
)
# The board layout (PCI addresses, PCIe roots, NUMA nodes) every fleet node has: the HGX one.
_LAYOUT_PROFILE = "h100-8x"
_TEMPLATE_NODE = "fleet-template-node"


def node_name(i: int) -> str:
    """The name of fleet node ``i`` (0-based), as the bed names its nodes."""
    return f"gpu-node-{i + 1}"


def node_kind(i: int, mig: bool) -> NodeKind:
    """The kind of fleet node ``i``: a pure function of the index, so batches agree."""
    kinds = MIG_KINDS if mig else PLAIN_KINDS
    return kinds[i % len(kinds)]


def plugin_slices(nodes: int, *, mig_nodes: int = 0, driver: str = DRIVER, first: int = 0) -> list[dict[str, Any]]:
    """The ResourceSlices of fleet nodes ``first`` .. ``first + nodes - 1``, in node order.

    The first ``mig_nodes`` of them run the plugin with dynamic MIG. A plain node has one slice
    (8 devices); a dynamic-MIG node has one counter-set slice and its device slices. Slices carry
    ``metadata.name`` (deterministic, ``generateName`` plus a suffix) and no ownerReferences (the
    Node's UID is the API server's): add them with :func:`owned_by` when creating the slices.
    """
    if nodes < 0 or not 0 <= mig_nodes <= nodes or first < 0:
        raise ValueError(f"fleet: need 0 <= mig_nodes ({mig_nodes}) <= nodes ({nodes}) and first ({first}) >= 0")
    out: list[dict[str, Any]] = []
    for i in range(first, first + nodes):
        kind = node_kind(i, mig=i - first < mig_nodes)
        out.extend(_instantiate(_template(kind, driver), kind, node_name(i)))
    return out


def owned_by(slice_obj: dict[str, Any], node_uid: str) -> dict[str, Any]:
    """The slice with the controller ownerReference to its Node the plugin sets."""
    node = slice_obj["spec"]["nodeName"]
    body = dict(slice_obj)
    body["metadata"] = {**slice_obj["metadata"], "ownerReferences": [
        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}]}
    return body


def plugin_path_slices(kind: NodeKind, node: str, driver: str = DRIVER) -> list[dict[str, Any]]:
    """The slices ``dra-driver kubelet-plugin`` publishes for a simulated node of ``kind``."""
    return published_slices(node_profile(kind), node, driver=driver, dynamic_mig=kind.dynamic_mig)


def published_slices(profile: NodeProfile, node: str, *, driver: str = DRIVER, dynamic_mig: bool = False,
                     api_profile: ApiProfile = OWN, shares: ConsumableShares = DISABLED) -> list[dict[str, Any]]:
    """The create bodies of the slices ``dra-driver kubelet-plugin`` publishes for node ``node``
    simulated from ``profile``, in the plugin's order (with dynamic MIG: the counter sets first):
    discovery, description (in ``api_profile``'s names), the pool split into slices and checked, and
    the publisher's plan. Named ``generateName`` plus a reproducible suffix, without ownerReferences
    (see :func:`owned_by`)."""
    backend = SimulatedBackend(profile, node)
    devices = enumerate_devices(backend.discover(), dynamic_mig, api_profile)
    devices_json, counters_json = describe(devices, driver, dynamic_mig, shares, api_profile)
    contents = split_into_slices(devices_json, counters_json)
    validate_pool(contents)
    bodies = []
    for op in plan(contents, [], PoolOwner(driver, node, node_uid="")).ops:
        assert op.kind == "create" and op.body is not None
        body = op.body
        metadata = body["metadata"]
        metadata.pop("ownerReferences", None)
        metadata["name"] = metadata["generateName"] + _suffix(metadata["generateName"])
        bodies.append(body)
    return bodies


@cache
def node_profile(kind: NodeKind) -> NodeProfile:
    """8 GPUs of the kind's model on the
    HGX board layout, with the driver versions of the model's shipped profile."""
    source = _shipped(kind.profile)
    layout = _shipped(_LAYOUT_PROFILE)["gpus"]
    gpus = [{k: v for k, v in gpu.items() if k != "mig"} | {"model": kind.model} for gpu in layout]
    assert len(gpus) == GPUS_PER_NODE
    document = {
        "description": f"fleet node: {GPUS_PER_NODE}x {kind.model}" + (", dynamic MIG" if kind.dynamic_mig else ""),
        "driverVersion": source["driverVersion"],
        "cudaDriverVersion": source["cudaDriverVersion"],
        "models": {kind.model: source["models"][kind.model]},
        "gpus": gpus,
    }
    return parse_profile(document, name=f"fleet-{kind.model}{'-mig' if kind.dynamic_mig else ''}")


def _shipped(name: str) -> dict[str, Any]:
    text = resources.files("dra_driver").joinpath("profiles", f"{name}.yaml").read_text()
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def _suffix(text: str) -> str:
    # The API server appends 5 random characters to generateName; a hash keeps names reproducible.
    return hashlib.sha256(text.encode()).hexdigest()[:5]


@cache
def _template(kind: NodeKind, driver: str) -> str:
    return json.dumps(plugin_path_slices(kind, _TEMPLATE_NODE, driver))


def _uuids(kind: NodeKind, node: str) -> tuple[str, ...]:
    """Every UUID the simulated backend derives from the node name, GPUs and their MIG instances."""
    result = []
    for gpu in node_profile(kind).gpus:
        parent = gpu_uuid(node, gpu.index)
        result.append(parent)
        for instance in gpu.instances:
            placement = next(p for prof in gpu.model.mig_profiles if prof.name == instance.profile
                             for p in prof.placements if p.start == instance.placement)
            result.append(mig_uuid(parent, instance.profile, placement))
    return tuple(result)


@cache
def _template_uuids(kind: NodeKind) -> tuple[str, ...]:
    return _uuids(kind, _TEMPLATE_NODE)


def _instantiate(template: str, kind: NodeKind, node: str) -> list[dict[str, Any]]:
    text = template
    for old, new in zip(_template_uuids(kind), _uuids(kind, node), strict=True):
        text = text.replace(old, new)
    slices: list[dict[str, Any]] = json.loads(text.replace(_TEMPLATE_NODE, node))
    for body in slices:
        metadata = body["metadata"]
        metadata["name"] = metadata["generateName"] + _suffix(metadata["generateName"])
    return slices
