"""NVIDIA's device plugin configuration, read as the device plugin reads it (its ``api/config/v1``).

One config is a YAML (or JSON) document::

    version: v1
    flags:
      migStrategy: none | single | mixed
    sharing:
      timeSlicing:            # or mps: (the device plugin gives MPS precedence when both are set)
        renameByDefault: false
        failRequestsGreaterThanOne: false
        resources:
        - name: nvidia.com/gpu   # a bare name gets the nvidia.com/ prefix, as theirs does
          rename: nvidia.com/gpu.shared
          replicas: 4

A missing ``version`` is ``v1``; any other version is refused, as theirs refuses it. The device
plugin's chart and the GPU Operator keep several configs in one ConfigMap, one key per config; a
node picks its config by the label ``nvidia.com/device-plugin.config``, and a node without the
label gets the default one (the chart's ``config.default``, the ClusterPolicy's
``devicePlugin.config.default``; here ``--default-config``, or the only key). Pure: nothing here
reads the cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import yaml

from dra_driver.k8s.objects import as_mapping, as_str, meta

CONFIG_LABEL = "nvidia.com/device-plugin.config"
"""The Node label naming the config a node's device plugin runs with (the device plugin's config manager reads it)."""
VERSION = "v1"
PREFIX = "nvidia.com"
SHARED_SUFFIX = ".shared"
MAX_RESOURCE_NAME = 63
OUTPUTS = ("text", "yaml", "json")
"""``migrate -o``: yaml and json print the DeviceClasses, text the report."""
FILE_CONFIG = "(file)"
"""The name of the one config read from a plain config file, which every node uses."""
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class MigrateError(ValueError):
    """Input ``migrate`` cannot use; the message names the object and what is wrong."""


class MigStrategy(StrEnum):
    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


class SharingKind(StrEnum):
    TIME_SLICING = "timeSlicing"
    MPS = "mps"


@dataclass(frozen=True)
class Replicated:
    """One ``sharing.*.resources[]`` entry: ``name`` shared ``replicas`` ways, advertised as ``advertised``."""

    name: str
    replicas: int
    rename: str = ""

    @property
    def advertised(self) -> str:
        return self.rename or self.name


@dataclass(frozen=True)
class Sharing:
    kind: SharingKind
    resources: tuple[Replicated, ...]
    fail_requests_greater_than_one: bool = False


@dataclass(frozen=True)
class PluginConfig:
    """One device plugin config; ``name``: its key in the ConfigMap (:data:`FILE_CONFIG` for a file)."""

    name: str
    mig_strategy: MigStrategy = MigStrategy.NONE
    sharing: Sharing | None = None

    def replicated(self, resource: str) -> Replicated | None:
        for entry in self.sharing.resources if self.sharing else ():
            if entry.name == resource:
                return entry
        return None


def resource_name(value: Any, where: str) -> str:
    """A resource name as the device plugin reads it: ``nvidia.com/`` added to a bare name, at most 63 characters."""
    if not isinstance(value, str) or not value:
        raise MigrateError(f"{where}: a resource name must be a non-empty string, got {value!r}")
    name = value if value.startswith(PREFIX + "/") else f"{PREFIX}/{value}"
    if len(name) > MAX_RESOURCE_NAME:
        raise MigrateError(f"{where}: resource name {name!r} is longer than {MAX_RESOURCE_NAME} characters")
    if not _NAME.match(name.partition("/")[2]):
        raise MigrateError(f"{where}: {name!r} is not a valid resource name")
    return name


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MigrateError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def _boolean(value: Any, where: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise MigrateError(f"{where} must be true or false, got {value!r}")
    return value


def _sharing(kind: SharingKind, raw: Any, where: str) -> Sharing | None:
    body = _mapping(raw, where)
    if not body:
        return None
    rename_by_default = _boolean(body.get("renameByDefault"), f"{where}.renameByDefault")
    fail_more = _boolean(body.get("failRequestsGreaterThanOne"), f"{where}.failRequestsGreaterThanOne")
    entries = body.get("resources")
    if not isinstance(entries, list) or not entries:
        raise MigrateError(f"{where}.resources: no resources specified")
    resources: list[Replicated] = []
    for i, entry in enumerate(entries):
        at = f"{where}.resources[{i}]"
        item = _mapping(entry, at)
        name = resource_name(item.get("name"), f"{at}.name")
        replicas = item.get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise MigrateError(f"{at}.replicas must be a positive integer, got {replicas!r}")
        rename = item.get("rename")
        renamed = resource_name(rename, f"{at}.rename") if rename else (name + SHARED_SUFFIX if rename_by_default else "")
        devices = item.get("devices", "all")
        if devices != "all":
            # A subset of the GPUs (a count or a list of indices/UUIDs): this driver cannot say
            # which of a node's GPUs are shared from the config alone.
            raise MigrateError(f"{at}.devices: only 'all' can be migrated, got {devices!r}")
        resources.append(Replicated(name, replicas, renamed))
    advertised = [r.advertised for r in resources]
    for name in advertised:
        if advertised.count(name) > 1:
            raise MigrateError(f"{where}.resources: two resources are advertised as {name!r}")
    return Sharing(kind, tuple(resources), fail_more)


def parse_config(text: str | bytes, name: str = FILE_CONFIG) -> PluginConfig:
    """One config document; MigrateError naming ``name`` for what the device plugin would refuse too."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MigrateError(f"config {name}: not YAML: {' '.join(str(exc).split())}") from None
    return config_from(doc, name)


def config_from(doc: Any, name: str) -> PluginConfig:
    body = _mapping(doc, f"config {name}")
    version = body.get("version") or VERSION
    if version != VERSION:
        raise MigrateError(f"config {name}: unknown version {version!r} (the device plugin's config is {VERSION})")
    flags = _mapping(body.get("flags"), f"config {name}: flags")
    strategy = flags.get("migStrategy") or MigStrategy.NONE.value
    if strategy not in tuple(MigStrategy):
        raise MigrateError(f"config {name}: flags.migStrategy must be none, single or mixed, got {strategy!r}")
    sharing_body = _mapping(body.get("sharing"), f"config {name}: sharing")
    mps = _sharing(SharingKind.MPS, sharing_body.get("mps"), f"config {name}: sharing.mps")
    time_slicing = _sharing(SharingKind.TIME_SLICING, sharing_body.get("timeSlicing"),
                            f"config {name}: sharing.timeSlicing")
    return PluginConfig(name, MigStrategy(strategy), mps or time_slicing)


def configs_from_configmap(configmap: Mapping[str, Any]) -> dict[str, PluginConfig]:
    """Every config of a multi-config ConfigMap (``data`` keys are config names)."""
    metadata = meta(configmap)
    what = f"ConfigMap {as_str(metadata.get('namespace')) or ''}/{as_str(metadata.get('name')) or ''}".replace(" /", " ")
    data = configmap.get("data")
    if not isinstance(data, Mapping) or not data:
        raise MigrateError(f"{what} has no data: no device plugin config to read")
    configs: dict[str, PluginConfig] = {}
    for key in sorted(data):
        value = data[key]
        if not isinstance(value, str):
            raise MigrateError(f"{what}: key {key!r} is not text")
        try:
            configs[str(key)] = parse_config(value, str(key))
        except MigrateError as exc:
            raise MigrateError(f"{what}: {exc}") from None
    return configs


def read_file_text(text: str, source: str) -> dict[str, PluginConfig]:
    """``-f``: a config file, or a ConfigMap manifest (``kind: ConfigMap``) holding several."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MigrateError(f"{source}: not YAML: {' '.join(str(exc).split())}") from None
    if isinstance(doc, Mapping) and doc.get("kind") == "ConfigMap":
        return configs_from_configmap(doc)
    try:
        return {FILE_CONFIG: config_from(doc, FILE_CONFIG)}
    except MigrateError as exc:
        raise MigrateError(f"{source}: {exc}") from None


def default_config(configs: Mapping[str, PluginConfig], chosen: str | None) -> str | None:
    """The config of nodes without the label: ``chosen``, else the only one, else none (such nodes are reported)."""
    if chosen is not None:
        if chosen not in configs:
            raise MigrateError(f"default config {chosen!r} is not one of the configs read ({', '.join(sorted(configs))})")
        return chosen
    return next(iter(configs)) if len(configs) == 1 else None


def node_configs(nodes: Sequence[Mapping[str, Any]], configs: Mapping[str, PluginConfig],
                 default: str | None) -> dict[str, PluginConfig | None]:
    """Each node's config, by its label (a file's one config for all); None: a node whose config is
    unknown (no label and no default). A label naming no config is an error, naming the node."""
    out: dict[str, PluginConfig | None] = {}
    for node in nodes:
        name = as_str(meta(node).get("name")) or ""
        label = as_str(as_mapping(meta(node).get("labels")).get(CONFIG_LABEL))
        if FILE_CONFIG in configs:
            out[name] = configs[FILE_CONFIG]
        elif label is not None:
            if label not in configs:
                raise MigrateError(f"Node {name}: label {CONFIG_LABEL}={label} names no config of the ConfigMap "
                                   f"({', '.join(sorted(configs))})")
            out[name] = configs[label]
        else:
            out[name] = configs[default] if default is not None else None
    return out
