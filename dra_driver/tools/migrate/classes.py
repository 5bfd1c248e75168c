"""The DeviceClasses, with ``extendedResourceName``, that serve the device plugin's resource names
through this driver (KEP-5004), decided from the nodes' device plugin configs and the MIG profiles
this driver publishes.

What each name meant under the device plugin, node by node, and what serves it here:

* ``nvidia.com/gpu`` with ``migStrategy: none`` or ``mixed``: a full GPU (``type == 'gpu'``).
* ``nvidia.com/gpu`` with ``single``: a MIG device (``type == 'mig'``), or a full GPU on a node
  without MIG devices.
* ``nvidia.com/mig-<profile>`` with ``mixed``: a MIG device of that profile, one class per profile
  this driver publishes somewhere in the fleet.
* a ``sharing.timeSlicing`` (or ``mps``) resource of ``replicas: N``, under its own or its new
  name: one of N shares of the device, which this driver publishes with ``--consumable-shares=N``
  (a ``shares`` capacity of N, each claim consuming the default of 1): the class selects devices
  published with ``allowMultipleAllocations`` and ``shares`` equal to N. MPS adds the class config
  ``GpuConfig`` ``sharing.strategy: MPS``. A pod's ``nvidia.com/gpu.shared: 1`` becomes a claim of
  one share (exactly the device plugin's meaning); a count of ``k > 1`` becomes ``k`` devices of the
  class, each a share, which the scheduler may take from different GPUs (the device plugin may hand
  out ``k`` replicas of one GPU): that is reported, with the claim template to use instead.

A name that means different things on different nodes gets one class whose selector takes each
node's meaning (``||``): Kubernetes allows one class per name, and a device selector cannot name a
node, so each meaning holds on every node that publishes such a device. A class that already serves
the name with the same selector serves it (none is generated): one in the cluster, or, where the
cluster has no class of its name yet, one the chart installs under the driver's API profile
(``gpu.nvidia.com`` for ``nvidia.com/gpu`` under ``--api-profile nvidia``, :mod:`dra_driver.apiprofile`).
A name another DeviceClass already claims with a different selector (the chart's class of the
profile included, installed or not), a name that is MPS-shared on some nodes and not on others,
and a time-sliced MIG profile no node has are errors. Pure: the cluster is read and written by
:mod:`dra_driver.tools.migrate.command`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver import CONFIG_API_VERSION, apiprofile
from dra_driver.k8s.bodies import RawDeviceClass
from dra_driver.k8s.names import is_dns_subdomain
from dra_driver.k8s.objects import as_list, as_mapping, as_mappings, as_str, meta
from dra_driver.tools.migrate.config import MigrateError, MigStrategy, PluginConfig, Replicated, SharingKind

GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "dra-driver-migrate"
RESOURCE_ANNOTATION = "gpu.dra-driver.io/device-plugin-resource"


@dataclass(frozen=True, order=True)
class Backing:
    """What one name is on one node: ``base`` ``gpu``, ``mig`` or ``mig:<profile>``; ``shares``: N
    of a time-sliced or MPS resource (0: the device itself)."""

    base: str
    shares: int = 0
    mps: bool = False

    def expression(self, driver: str) -> str:
        attrs = f"device.attributes['{driver}']"
        kind, _, profile = self.base.partition(":")
        text = f"{attrs}.type == '{kind}'"
        if profile:
            text += f" && {attrs}.profile == '{profile}'"
        if self.shares:
            text += (f" && device.allowMultipleAllocations && device.capacity['{driver}'].shares"
                     f".compareTo(quantity('{self.shares}')) == 0")
        return text

    def describe(self) -> str:
        kind, _, profile = self.base.partition(":")
        what = f"a MIG device of profile {profile}" if profile else "a MIG device" if kind == "mig" else "a full GPU"
        if self.shares:
            return f"one of {self.shares} {'MPS ' if self.mps else ''}shares of {what}"
        return what


@dataclass
class Served:
    """A device plugin name and the class that serves it: the class is ``generated`` by migrate or
    an existing one whose selector is the same."""

    resource: str
    class_name: str
    backings: dict[Backing, list[str]] = field(default_factory=dict)
    """Each meaning and the nodes it has there."""
    generated: bool = True
    installed: bool = True
    """An existing class (not ``generated``) is in the cluster; False: it is the chart's class of the
    driver's API profile, which serves the name once the chart is installed."""
    current: bool = False
    """The cluster holds the class as wanted already: nothing to apply."""
    same_devices: str | None = None
    """A class of the profile (``mig.nvidia.com``) that selects exactly the devices a generated class does."""
    refused_more: bool = False
    """A config sharing it says ``failRequestsGreaterThanOne``: the device plugin refused a count above 1."""

    @property
    def shares(self) -> int:
        return max((b.shares for b in self.backings), default=0)


@dataclass(frozen=True)
class Plan:
    served: dict[str, Served]
    classes: list[dict[str, Any]]
    """The DeviceClasses to apply (migrate's own and the ones whose selectors change)."""
    assumed: list[RawDeviceClass] = field(default_factory=list)
    """The profile's chart classes that serve a name and are not in the cluster, as the chart installs them."""


def class_name(resource: str, driver: str) -> str:
    """``nvidia.com/mig-1g.10gb`` → ``nvidia-mig-1g.10gb.<driver>``, as the chart names ``nvidia-gpu.<driver>``."""
    domain, _, name = resource.partition("/")
    text = f"{domain.split('.')[0]}-{name}".lower().replace("_", "-")
    full = f"{text}.{driver}"
    if not is_dns_subdomain(full):
        raise MigrateError(f"resource {resource!r}: the class name {full!r} is not a valid DeviceClass name")
    return full


def mig_profiles(slices: Iterable[Mapping[str, Any]], driver: str) -> dict[str, set[str]]:
    """The MIG profiles each node publishes through this driver (the ``profile`` attribute of ``type: mig`` devices)."""
    out: dict[str, set[str]] = {}
    for sl in slices:
        spec = as_mapping(sl.get("spec"))
        node_name = as_str(spec.get("nodeName"))
        if spec.get("driver") != driver or not node_name:
            continue
        node = out.setdefault(node_name, set())
        for device in as_mappings(spec.get("devices")):
            attrs = as_mapping(device.get("attributes"))
            profile = as_str(as_mapping(attrs.get("profile")).get("string"))
            if as_mapping(attrs.get("type")).get("string") == "mig" and profile:
                node.add(profile)
    return out


def advertised_profiles(nodes: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """The MIG profiles the device plugin advertises on each Node (``nvidia.com/mig-<profile>``, non-zero):
    where it still runs, this driver publishes nothing, so the Node is where the fleet's profiles are seen."""
    out: dict[str, set[str]] = {}
    for node in nodes:
        name = as_str(meta(node).get("name")) or ""
        status = as_mapping(node.get("status"))
        for field_name in ("capacity", "allocatable"):
            for resource, value in as_mapping(status.get(field_name)).items():
                if str(resource).startswith(MIG_PREFIX) and str(value).strip() not in ("", "0"):
                    out.setdefault(name, set()).add(str(resource).removeprefix(MIG_PREFIX))
    return out


def _base_of(resource: str, config: PluginConfig, has_mig: bool = True) -> str | None:
    """What a name the device plugin advertises unshared means on a node of ``config``; None: not a
    GPU name. ``has_mig``: the node has MIG devices (``single`` on a node without them serves its
    full GPUs as ``nvidia.com/gpu``, as the device plugin does)."""
    if resource == GPU_RESOURCE:
        return "mig" if config.mig_strategy is MigStrategy.SINGLE and has_mig else "gpu"
    if resource.startswith(MIG_PREFIX) and config.mig_strategy is MigStrategy.MIXED:
        return "mig:" + resource.removeprefix(MIG_PREFIX)
    return None


def node_names(config: PluginConfig, profiles: set[str]) -> dict[str, Backing]:
    """Every name a node of ``config`` advertised, with what it is; ``profiles``: the node's MIG
    profiles (a node that publishes none has only ``nvidia.com/gpu``)."""
    plain = [GPU_RESOURCE]
    if config.mig_strategy is MigStrategy.MIXED:
        plain += [MIG_PREFIX + p for p in sorted(profiles)]
    names: dict[str, Backing] = {}
    for resource in plain:
        base = _base_of(resource, config, bool(profiles))
        assert base is not None
        entry = config.replicated(resource)
        if entry is None:
            names[resource] = Backing(base)
        else:
            names[entry.advertised] = Backing(base, entry.replicas, _is_mps(config))
    for entry in config.sharing.resources if config.sharing else ():
        if entry.name not in plain:
            names.setdefault(entry.advertised, _unpublished(entry, config))
    return names


def _is_mps(config: PluginConfig) -> bool:
    return config.sharing is not None and config.sharing.kind is SharingKind.MPS


def _unpublished(entry: Replicated, config: PluginConfig) -> Backing:
    """A shared name whose device is not published on this node (a MIG profile it lacks): kept so
    that a profile no node has at all is an error, not a silent skip."""
    base = _base_of(entry.name, config)
    if base is None:
        raise MigrateError(f"config {config.name}: sharing resource {entry.name!r} is neither {GPU_RESOURCE} nor "
                           f"a MIG profile of the mixed strategy")
    return Backing(base, entry.replicas, _is_mps(config))


def selector(backings: Iterable[Backing], driver: str) -> str:
    parts = [b.expression(driver) for b in sorted(set(backings))]
    body = parts[0] if len(parts) == 1 else " || ".join(f"({p})" for p in parts)
    return f"device.driver == '{driver}' && {body}" if len(parts) == 1 else f"device.driver == '{driver}' && ({body})"


def device_class(served: Served, driver: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "extendedResourceName": served.resource,
        "selectors": [{"cel": {"expression": selector(served.backings, driver)}}],
    }
    if any(b.mps for b in served.backings):
        spec["config"] = [{"opaque": {"driver": driver, "parameters": {
            "apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": served.class_name, "labels": {MANAGED_BY: MANAGER},
                     "annotations": {RESOURCE_ANNOTATION: served.resource}},
        "spec": spec,
    }


def profile_classes(driver: str) -> list[RawDeviceClass]:
    """The DeviceClasses the chart installs under the driver's API profile, as its default values
    render their names and specs (``deviceClasses.extendedResourceName: nvidia.com/gpu``): NVIDIA's ``gpu.nvidia.com``
    and ``mig.nvidia.com`` under ``--api-profile nvidia``."""
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
             "metadata": {"name": spec.name},
             "spec": {**({"extendedResourceName": spec.extended_resource_name} if spec.extended_resource_name else {}),
                      "selectors": [{"cel": {"expression": apiprofile.class_selector(driver, spec.device_type)}}]}}
            for spec in apiprofile.for_driver(driver).device_classes(driver)]


def _claimants(existing: Sequence[RawDeviceClass]) -> dict[str, list[RawDeviceClass]]:
    out: dict[str, list[RawDeviceClass]] = {}
    for cls in existing:
        name = _served_name(cls)
        if name:
            out.setdefault(name, []).append(cls)
    return out


def _name(cls: RawDeviceClass) -> str:
    return as_str(meta(cls).get("name")) or ""


def _served_name(cls: RawDeviceClass) -> str | None:
    return as_str(as_mapping(cls.get("spec")).get("extendedResourceName"))


def _same_selection(cls: RawDeviceClass, wanted: Mapping[str, Any]) -> bool:
    spec, want = as_mapping(cls.get("spec")), wanted["spec"]
    return bool(as_list(spec.get("selectors")) == want["selectors"] and as_list(spec.get("config")) == want.get("config", []))


def plan_classes(configs: Mapping[str, PluginConfig | None], profiles: Mapping[str, set[str]],
                 existing: Sequence[RawDeviceClass], driver: str) -> Plan:
    """``configs``: each GPU node's config (None: unknown, left out); ``profiles``: the MIG profiles
    each node publishes; ``existing``: the cluster's DeviceClasses."""
    fleet_profiles = set().union(*profiles.values()) if profiles else set()
    served: dict[str, Served] = {}
    for node in sorted(configs):
        config = configs[node]
        if config is None:
            continue
        for resource, backing in node_names(config, profiles.get(node, set())).items():
            profile = backing.base.partition(":")[2]
            if profile and profile not in fleet_profiles:
                raise MigrateError(f"config {config.name}: MIG profile {profile} ({resource}) is published by no "
                                   f"node of driver {driver}")
            if profile and profile not in profiles.get(node, set()):
                continue
            entry = served.setdefault(resource, Served(resource, class_name(resource, driver)))
            entry.backings.setdefault(backing, []).append(node)
            if backing.shares and config.sharing is not None and config.sharing.fail_requests_greater_than_one:
                entry.refused_more = True
    installed = {_name(c) for c in existing}
    charts = profile_classes(driver)
    assumed = [c for c in charts if _name(c) not in installed and _served_name(c)]
    claimants = _claimants([*existing, *assumed])
    classes: list[dict[str, Any]] = []
    for resource, entry in sorted(served.items()):
        if len({b.mps for b in entry.backings}) > 1:
            nodes = sorted(n for b, ns in entry.backings.items() if b.mps for n in ns)
            raise MigrateError(f"{resource} is MPS-shared on nodes {', '.join(nodes)} and not on others: one "
                               "DeviceClass serves a name, with one config")
        wanted = device_class(entry, driver)
        others = [c for c in claimants.get(resource, []) if _name(c) != entry.class_name]
        same = [c for c in others if _same_selection(c, wanted)]
        if others and len(same) == len(others) and len(others) == 1:
            entry.class_name, entry.generated = _name(others[0]), False
            entry.installed = entry.class_name in installed
            continue
        if others:
            names = ", ".join(sorted(f"{_name(c)} ({'existing' if _name(c) in installed else _charts(driver)})"
                                     for c in others))
            raise MigrateError(f"{resource} would be claimed by two DeviceClasses: {names} and "
                               f"{entry.class_name}; Kubernetes allows one class per extendedResourceName "
                               "(remove it, or set the chart's deviceClasses.extendedResourceName to \"\")")
        entry.same_devices = next((_name(c) for c in charts if _same_selection(c, wanted)), None)
        mine = [c for c in existing if _name(c) == entry.class_name]
        if mine and _same_selection(mine[0], wanted) and _served_name(mine[0]) == resource:
            entry.current = True
            continue
        if mine and as_mapping(meta(mine[0]).get("labels")).get(MANAGED_BY) == "Helm":
            raise MigrateError(f"DeviceClass {entry.class_name} is the chart's and serves {resource} otherwise: set the "
                               "chart's deviceClasses.extendedResourceName to \"\" so that migrate's class replaces it")
        classes.append(wanted)
    for cls in classes:
        name = cls["metadata"]["name"]
        clash = [other for c in existing if _name(c) == name
                 and (other := _served_name(c)) not in (None, cls["spec"]["extendedResourceName"])]
        if clash:
            raise MigrateError(f"DeviceClass {name} exists and serves {clash[0]}, not {cls['spec']['extendedResourceName']}")
    return Plan(served, classes, assumed)


def _charts(driver: str) -> str:
    return f"the chart's under --api-profile {apiprofile.for_driver(driver).name}, not installed yet"
