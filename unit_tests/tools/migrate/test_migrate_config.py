"""The device plugin's config, read as the device plugin reads it."""

from __future__ import annotations

import pytest

from dra_driver.tools.migrate.config import (
    CONFIG_LABEL,
    FILE_CONFIG,
    MigrateError,
    MigStrategy,
    SharingKind,
    configs_from_configmap,
    default_config,
    node_configs,
    parse_config,
    read_file_text,
)

TIME_SLICING = """
version: v1
flags:
  migStrategy: none
sharing:
  timeSlicing:
    renameByDefault: {rename}
    resources:
    - name: gpu
      replicas: 4
"""


def test_time_slicing_without_rename_keeps_the_name() -> None:
    config = parse_config(TIME_SLICING.format(rename="false"))
    assert config.sharing is not None and config.sharing.kind is SharingKind.TIME_SLICING
    (entry,) = config.sharing.resources
    assert (entry.name, entry.replicas, entry.advertised) == ("nvidia.com/gpu", 4, "nvidia.com/gpu")


def test_rename_by_default_adds_shared() -> None:
    (entry,) = parse_config(TIME_SLICING.format(rename="true")).sharing.resources  # type: ignore[union-attr]
    assert entry.advertised == "nvidia.com/gpu.shared"


def test_explicit_rename_and_mps_and_defaults() -> None:
    config = parse_config("sharing:\n  mps:\n    failRequestsGreaterThanOne: true\n    resources:\n"
                          "    - {name: nvidia.com/gpu, rename: gpu.mps, replicas: 2}\n")
    assert config.mig_strategy is MigStrategy.NONE
    assert config.sharing is not None and config.sharing.kind is SharingKind.MPS
    assert config.sharing.fail_requests_greater_than_one
    assert config.sharing.resources[0].advertised == "nvidia.com/gpu.mps"


@pytest.mark.parametrize("text, message", [
    ("version: v2\n", "config (file): unknown version 'v2' (the device plugin's config is v1)"),
    ("flags: {migStrategy: half}\n", "flags.migStrategy must be none, single or mixed, got 'half'"),
    ("sharing: {timeSlicing: {resources: []}}\n", "sharing.timeSlicing.resources: no resources specified"),
    ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 0}]}}\n", "resources[0].replicas must be a positive"),
    ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, devices: [0]}]}}\n", "devices: only 'all'"),
    ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2, rename: a}, {name: mig-1g.10gb, replicas: 2, "
     "rename: a}]}}\n", "two resources are advertised as 'nvidia.com/a'"),
    ("[not, a, mapping]\n", "config (file) must be a mapping"),
    ("a: [\n", "config (file): not YAML"),
])
def test_refusals_name_the_field(text: str, message: str) -> None:
    with pytest.raises(MigrateError, match=None) as info:
        parse_config(text)
    assert message in str(info.value)


OPERATOR_CONFIGMAP = {
    "apiVersion": "v1", "kind": "ConfigMap",
    "metadata": {"name": "device-plugin-config", "namespace": "gpu-operator"},
    "data": {
        "default": "version: v1\nflags:\n  migStrategy: none\n",
        "a100-mixed": "version: v1\nflags:\n  migStrategy: mixed\n",
        "shared": TIME_SLICING.format(rename="true"),
    },
}


def node(name: str, label: str | None = None) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": {CONFIG_LABEL: label} if label else {}}}


def test_operator_configmap_nodes_choose_by_label() -> None:
    configs = configs_from_configmap(OPERATOR_CONFIGMAP)
    assert sorted(configs) == ["a100-mixed", "default", "shared"]
    chosen = node_configs([node("a", "a100-mixed"), node("b"), node("c", "shared")], configs,
                          default_config(configs, "default"))
    assert {n: c.name if c else None for n, c in chosen.items()} == {"a": "a100-mixed", "b": "default", "c": "shared"}


def test_without_default_unlabelled_nodes_are_unknown() -> None:
    configs = configs_from_configmap(OPERATOR_CONFIGMAP)
    assert node_configs([node("b")], configs, default_config(configs, None)) == {"b": None}


def test_label_naming_no_config_and_bad_default_are_errors() -> None:
    configs = configs_from_configmap(OPERATOR_CONFIGMAP)
    with pytest.raises(MigrateError, match=f"Node x: label {CONFIG_LABEL}=nope names no config"):
        node_configs([node("x", "nope")], configs, None)
    with pytest.raises(MigrateError, match="default config 'nope' is not one of"):
        default_config(configs, "nope")


def test_a_bad_key_names_the_configmap_and_the_key() -> None:
    bad = dict(OPERATOR_CONFIGMAP, data={"old": "version: v0\n"})
    with pytest.raises(MigrateError, match="ConfigMap gpu-operator/device-plugin-config: config old: unknown version"):
        configs_from_configmap(bad)
    with pytest.raises(MigrateError, match="has no data"):
        configs_from_configmap(dict(OPERATOR_CONFIGMAP, data={}))


def test_file_is_a_config_or_a_configmap_manifest() -> None:
    import yaml

    one = read_file_text(TIME_SLICING.format(rename="false"), "dp.yaml")
    assert list(one) == [FILE_CONFIG]
    # A plain file's config holds for every node, labelled or not.
    assert node_configs([node("a", "other")], one, None)["a"] is one[FILE_CONFIG]
    many = read_file_text(yaml.safe_dump(OPERATOR_CONFIGMAP), "cm.yaml")
    assert sorted(many) == ["a100-mixed", "default", "shared"]
    with pytest.raises(MigrateError, match=r"dp\.yaml: config .file.: unknown version 'v9'"):
        read_file_text("version: v9\n", "dp.yaml")
