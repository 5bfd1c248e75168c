"""How to move each node from NVIDIA's device plugin to this driver, never with both serving its GPUs.

The driver's plugin publishes nothing on a node whose Node still advertises ``nvidia.com/gpu``,
``nvidia.com/gpu.*`` or ``nvidia.com/mig-*`` (its publish gate, ``node/publish/gate.py``), so it can be installed on the
whole fleet first. Then, node by node: cordon it, move off the pods that use the device plugin's
names, take the device plugin off the node (the GPU Operator's label
``nvidia.com/gpu.deploy.device-plugin=false``, or the device plugin DaemonSet's own affinity),
wait until the Node advertises none of those names (the plugin then publishes), check the node's
ResourceSlices, and uncordon it. Pure: the steps are text for the nodes given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.k8s.objects import as_mapping, as_str, meta
from dra_driver.node.publish.gate import is_device_plugin_gpu
from dra_driver.tools.migrate.config import PluginConfig
from dra_driver.tools.migrate.workloads import asked_resources

OPERATOR_LABEL = "nvidia.com/gpu.deploy.device-plugin"
"""The GPU Operator deploys its device plugin on a node unless this label is ``false``."""


@dataclass(frozen=True)
class NodeState:
    name: str
    config: PluginConfig | None
    device_plugin: tuple[str, ...]
    """The device plugin's names the Node advertises now (non-zero)."""
    publishing: bool
    """Whether this driver publishes ResourceSlices for the node."""
    pods: tuple[str, ...] = ()
    """``namespace/name`` of the pods on the node that ask for a device plugin name."""

    @property
    def ungated(self) -> tuple[str, ...]:
        """The device plugin's names on the Node that the plugin's publish gate does not look at (renamed
        to a name of the config's own choosing)."""
        return tuple(n for n in self.device_plugin if not is_device_plugin_gpu(n))


def shares_flag(config: PluginConfig | None) -> str | None:
    """The plugin's ``--consumable-shares`` a node of ``config`` needs (its largest replica count)."""
    if config is None or config.sharing is None:
        return None
    return str(max(r.replicas for r in config.sharing.resources))


def node_steps(node: NodeState, driver: str) -> list[str]:
    """The steps for one node, in order; a node already moved gets the check only."""
    name = node.name
    check = f"kubectl get resourceslices --field-selector spec.nodeName={name},spec.driver={driver}"
    if not node.device_plugin:
        if node.publishing:
            return [f"already moved: the Node advertises no device plugin name and {driver} publishes its devices ({check})"]
        return [f"no device plugin name on the Node, and {driver} publishes nothing yet: check the plugin pod on "
                f"{name} and {check}"]
    steps = []
    if node.publishing:
        steps.append(f"WARNING: {driver} already publishes the GPUs of {name} while the device plugin advertises "
                     f"{', '.join(node.device_plugin)}: both can hand out one GPU; do the steps below at once")
    steps.append(f"kubectl cordon {name}")
    if node.ungated and not node.publishing:
        steps.append(f"keep {driver}'s plugin off {name} until the device plugin is gone: its publish gate does not "
                     f"hold back for {', '.join(node.ungated)}")
    if node.pods:
        steps.append(f"move off the pods that use the device plugin ({', '.join(node.pods)}): "
                     f"kubectl drain {name} --ignore-daemonsets --delete-emptydir-data")
    flag = shares_flag(node.config)
    if flag is not None:
        steps.append(f"run this driver's plugin on {name} with --consumable-shares={flag} "
                     f"(chart value consumableShares) so its GPUs are published as {flag} shares")
    steps += [
        f"kubectl label node {name} {OPERATOR_LABEL}=false --overwrite   "
        "# GPU Operator; with the device plugin's own chart, exclude the node in its DaemonSet's affinity",
        f"wait until the Node advertises none of {', '.join(node.device_plugin)}: "
        f"kubectl get node {name} -o jsonpath='{{.status.allocatable}}'",
        f"{check}   # this driver publishes the node's GPUs once the device plugin is gone",
        f"kubectl uncordon {name}",
    ]
    return steps


def fleet_steps(nodes: Sequence[NodeState], driver: str) -> dict[str, list[str]]:
    return {n.name: node_steps(n, driver) for n in sorted(nodes, key=lambda n: n.name)}


def pods_by_node(pods: Sequence[Mapping[str, Any]], names: set[str]) -> dict[str, list[str]]:
    """``namespace/name`` of the running pods of each node that ask for one of ``names``."""
    out: dict[str, list[str]] = {}
    for pod in pods:
        spec = as_mapping(pod.get("spec"))
        node = as_str(spec.get("nodeName"))
        if not node:
            continue
        asked = {str(name) for _, resources in asked_resources(spec) for name in resources}
        if asked & names:
            out.setdefault(node, []).append(f"{as_str(meta(pod).get('namespace'))}/{as_str(meta(pod).get('name'))}")
    return out
