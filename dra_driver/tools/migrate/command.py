"""``dra-driver migrate`` (``kubectl dra migrate``): from NVIDIA's device plugin to this driver.

Reads the device plugin's config (``-f FILE``: a config file or a ConfigMap manifest;
``--configmap NAMESPACE/NAME``: the ConfigMap the device plugin's chart or the GPU Operator names,
nodes choosing a key by their ``nvidia.com/device-plugin.config`` label, ``--default-config`` for
the others), the Nodes, this driver's ResourceSlices (the MIG profiles the fleet has), the
DeviceClasses and the workloads; prints the DeviceClasses that serve the device plugin's names
(``-o yaml|json``, ready for ``kubectl apply -f -``), or a report (``-o text``: the classes, every
workload asking for a device plugin name and what serves it, the steps for each node); ``--apply``
creates the classes (or updates those it made before) and is the only mode that writes. Every
failure is one line on stderr and exit status 1, as ``explain``'s. The decisions are the pure
modules' (:mod:`.config`, :mod:`.classes`, :mod:`.workloads`, :mod:`.steps`); this module is the
edge that reads and writes the cluster.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import yaml

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.k8s.bodies import RawDeviceClass
from dra_driver.k8s.client import (
    CONFIGMAPS,
    DEVICE_CLASSES,
    NODES,
    PODS,
    SLICES,
    ApiError,
    KubeApi,
    KubeconfigError,
    Resource,
    RestKubeApi,
)
from dra_driver.k8s.names import is_dns_label, is_dns_subdomain
from dra_driver.k8s.objects import as_list, as_mapping, as_str, meta
from dra_driver.tools.migrate import classes, config, steps, workloads
from dra_driver.tools.migrate.config import CONFIG_LABEL, OUTPUTS, MigrateError
from dra_driver.tools.terminal import api_error_line, one_line, printable

DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", namespaced=True)
STATEFULSETS = Resource("apps", "v1", "statefulsets", "StatefulSet", namespaced=True)
DAEMONSETS = Resource("apps", "v1", "daemonsets", "DaemonSet", namespaced=True)
JOBS = Resource("batch", "v1", "jobs", "Job", namespaced=True)
CRONJOBS = Resource("batch", "v1", "cronjobs", "CronJob", namespaced=True)
WORKLOADS = (PODS, DEPLOYMENTS, STATEFULSETS, DAEMONSETS, JOBS, CRONJOBS)


@dataclass(frozen=True)
class Fleet:
    """What migrate reads of the cluster."""

    nodes: Sequence[Mapping[str, Any]]
    slices: Sequence[Mapping[str, Any]]
    device_classes: Sequence[RawDeviceClass]
    workloads: Sequence[Mapping[str, Any]]


def configmap_ref(text: str) -> tuple[str, str]:
    namespace, slash, name = text.partition("/")
    if not slash or not is_dns_label(namespace) or not is_dns_subdomain(name):
        raise MigrateError(f"--configmap must be NAMESPACE/NAME, got {text!r}")
    return namespace, name


def read_configmap(api: KubeApi, ref: str) -> dict[str, config.PluginConfig]:
    namespace, name = configmap_ref(ref)
    try:
        body = api.get(CONFIGMAPS, name, namespace=namespace)
    except ApiError as exc:
        if exc.unreachable:
            raise
        why = "not found" if exc.not_found else "not allowed" if (exc.forbidden or exc.unauthorized) else str(exc)
        raise MigrateError(f"cannot read ConfigMap {namespace}/{name}: {why}") from None
    return config.configs_from_configmap(body)


def read_fleet(api: KubeApi) -> Fleet:
    listed = [item for res in WORKLOADS for item in api.list(res).items]
    return Fleet(nodes=list(api.list(NODES).items), slices=list(api.list(SLICES).items),
                 device_classes=list(api.list(DEVICE_CLASSES).items), workloads=listed)


def device_plugin_names(node: Mapping[str, Any], served: Mapping[str, Any]) -> list[str]:
    """The device plugin's names a Node advertises (non-zero): ``nvidia.com/...`` and the names the configs serve."""
    status = as_mapping(node.get("status"))
    names = {str(name) for field in ("capacity", "allocatable") for name, value in as_mapping(status.get(field)).items()
             if (str(name).startswith("nvidia.com/") or name in served) and str(value).strip() not in ("", "0")}
    return sorted(names)


def gpu_nodes(fleet: Fleet, profiles: Mapping[str, set[str]]) -> list[Mapping[str, Any]]:
    """The nodes with GPUs: the device plugin's names on the Node, this driver's slices, or the config label."""
    return [n for n in fleet.nodes if device_plugin_names(n, {}) or node_name(n) in profiles
            or CONFIG_LABEL in as_mapping(meta(n).get("labels"))]


def node_name(node: Mapping[str, Any]) -> str:
    return as_str(meta(node).get("name")) or ""


def apply_classes(api: KubeApi, wanted: Sequence[Mapping[str, Any]]) -> list[str]:
    """Create each class, or replace the one of that name; what was done, one line each."""
    done: list[str] = []
    for body in wanted:
        name = str(body["metadata"]["name"])
        try:
            api.create(DEVICE_CLASSES, dict(body))
            done.append(f"deviceclass.resource.k8s.io/{name} created")
        except ApiError as exc:
            if not exc.conflict:
                raise
            current = api.get(DEVICE_CLASSES, name)
            replaced = {**body, "metadata": {**body["metadata"], "resourceVersion": meta(current).get("resourceVersion")}}
            api.replace(DEVICE_CLASSES, replaced)
            done.append(f"deviceclass.resource.k8s.io/{name} configured")
    return done


def build_report(configs: Mapping[str, config.PluginConfig], fleet: Fleet, *, default: str | None, driver: str,
                 fit: workloads.FitFn | None = None) -> dict[str, Any]:
    published = classes.mig_profiles(fleet.slices, driver)
    profiles = {name: published.get(name, set()) | seen
                for name, seen in {**{n: set() for n in published}, **classes.advertised_profiles(fleet.nodes)}.items()}
    nodes = gpu_nodes(fleet, profiles)
    publishing = {as_str(spec.get("nodeName")) for s in fleet.slices
                  if (spec := as_mapping(s.get("spec"))).get("driver") == driver and as_list(spec.get("devices"))}
    by_node = config.node_configs(nodes, configs, config.default_config(configs, default))
    plan = classes.plan_classes(by_node, profiles, fleet.device_classes, driver)
    rows = workloads.report(fleet.workloads, plan.served, driver, fit, [*plan.classes, *plan.assumed])
    names = {r["resource"] for r in rows} | set(plan.served)
    pods = steps.pods_by_node([w for w in fleet.workloads if w.get("kind") == "Pod"], names)
    states = [steps.NodeState(name=node_name(n), config=by_node.get(node_name(n)),
                              device_plugin=tuple(device_plugin_names(n, plan.served)),
                              publishing=node_name(n) in publishing, pods=tuple(pods.get(node_name(n), ())))
              for n in nodes]
    return {
        "classes": plan.classes,
        "served": [{"resource": s.resource, "deviceClass": s.class_name, "generated": s.generated,
                    "installed": s.installed, "sameDevicesAs": s.same_devices,
                    "meanings": {b.describe(): sorted(ns) for b, ns in sorted(s.backings.items())}}
                   for s in sorted(plan.served.values(), key=lambda s: s.resource)],
        "unknownConfig": sorted(n for n, c in by_node.items() if c is None),
        "workloads": rows,
        "steps": steps.fleet_steps(states, driver),
    }


def _yaml(doc: Any) -> str:
    return yaml.safe_dump(json.loads(json.dumps(doc, default=str)), sort_keys=False, allow_unicode=True).rstrip()


def render_text(report: Mapping[str, Any], applied: Sequence[str]) -> str:
    lines: list[str] = list(applied)
    lines.append("Device plugin names and the DeviceClasses that serve them:")
    pending = {c["metadata"]["name"] for c in report["classes"]}
    for s in report["served"]:
        state = "to apply" if s["deviceClass"] in pending else "up to date" if s["generated"] else (
            "exists: it serves the name already" if s["installed"] else
            "the chart's class of this API profile: it serves the name once the chart is installed; none generated")
        if applied and s["deviceClass"] in pending:
            state = "applied"
        lines.append(f"  {s['resource']} -> {s['deviceClass']} ({state})")
        if s["sameDevicesAs"]:
            lines.append(f"      the same devices as class {s['sameDevicesAs']}, which does not serve {s['resource']}")
        for meaning, nodes in s["meanings"].items():
            lines.append(f"      {meaning}: {', '.join(nodes)}")
    if report["unknownConfig"]:
        lines.append(f"Nodes whose config is unknown (no {CONFIG_LABEL} label, no --default-config): "
                     + ", ".join(report["unknownConfig"]))
    lines.append("Workloads that ask for a device plugin name:" if report["workloads"] else
                 "No workload asks for a device plugin name.")
    for row in report["workloads"]:
        head = f"  {row['workload']} {row['resource']}: {row['count']}"
        if row["served"]:
            head += f" -> served by {row['deviceClass']} as {row['meaning']}"
        else:
            head += " -> not served"
        if "fit" in row:
            head += f"; fits now: {row['fit']}"
        lines.append(head)
        if row.get("note"):
            lines.append(f"      {row['note']}")
        if row.get("template"):
            lines.append("      write instead:")
            lines += ["        " + line for line in _yaml(row["template"]).splitlines()]
    lines.append("Steps, node by node (install this driver first: it publishes nothing where the device plugin runs):")
    for node, todo in report["steps"].items():
        lines.append(f"  {node}:")
        lines += [f"    {i}. {step}" for i, step in enumerate(todo, 1)]
    return "\n".join(lines)


def main(
    filename: str | None = None,
    configmap: str | None = None,
    *,
    default_config: str | None = None,
    output: str = "text",
    apply: bool = False,
    kubeconfig: str | None = None,
    context: str | None = None,
    driver: str = DEFAULT_DRIVER_NAME,
    api: KubeApi | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    fitter: Callable[[KubeApi], workloads.FitFn] | None = None,
    read_text: Callable[[str], str] | None = None,
    prog: str = "dra-driver migrate",
) -> int:
    """``filename`` or ``configmap`` (``NAMESPACE/NAME``), one of them; ``fitter``: the fleet view's
    fit for a workload, made with the client migrate reads through (None: the report leaves it
    out); ``read_text``: how ``filename`` is read
    (``-`` is stdin)."""
    stdout, stderr = out or sys.stdout, err or sys.stderr
    owned: RestKubeApi | None = None
    try:
        if output not in OUTPUTS:
            raise MigrateError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
        if (filename is None) == (configmap is None):
            raise MigrateError("name the device plugin's config: -f FILE or --configmap NAMESPACE/NAME (one of them)")
        configs: dict[str, config.PluginConfig] | None = None
        if filename is not None:
            configs = config.read_file_text((read_text or _read_text)(filename), filename)
        else:
            configmap_ref(str(configmap))
        if api is None:
            owned = RestKubeApi.from_kubeconfig(kubeconfig, context, request_timeout=15.0)
            api = owned
        if configs is None:
            configs = read_configmap(api, str(configmap))
        report = build_report(configs, read_fleet(api), default=default_config, driver=driver,
                              fit=fitter(api) if fitter is not None else None)
        applied = apply_classes(api, report["classes"]) if apply else []
    except (MigrateError, KubeconfigError) as exc:
        print(f"{prog}: {one_line(exc)}", file=stderr)
        return 1
    except ApiError as exc:
        print(f"{prog}: {api_error_line(exc)}", file=stderr)
        return 1
    except Exception as exc:  # last resort: never a traceback for a user
        print(f"{prog}: unexpected error: {type(exc).__name__}: {one_line(exc)}", file=stderr)
        return 1
    finally:
        if owned is not None:
            owned.close()
    if output == "json":
        print(json.dumps({"apiVersion": "v1", "kind": "List", "items": report["classes"]}, indent=2), file=stdout)
    elif output == "yaml":
        if report["classes"]:
            print("\n---\n".join(_yaml(c) for c in report["classes"]), file=stdout)
    else:
        print(printable(render_text(report, applied)), file=stdout)
    return 0


def _read_text(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise MigrateError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
