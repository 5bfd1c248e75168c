"""e2e/manifests/nvidia: NVIDIA's published examples in their shape. Each file parses, names only
NVIDIA's classes (or one it defines), reads only attributes NVIDIA's driver publishes, wires every
container to a claim request that exists, and its opaque configs decode to the sharing the
example's README describes; the refused ones fail with the field or kind named."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.allocator.cel.compile import compile_selector
from dra_driver.allocator.cel.reads import selector_reads
from dra_driver.gpuconfig import EXCLUSIVE, MpsSettings, SharingConfig, Strategy, TimeSliceInterval
from dra_driver.opaqueconfig import RequestConfigError, Target, resolve_sharing

ROOT = Path(__file__).resolve().parents[2] / "e2e" / "manifests" / "nvidia"
DRIVER = "gpu.nvidia.com"
CLASSES = {"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig"}
"""The DeviceClasses the chart installs under --api-profile nvidia, and the device type of each."""
ATTRIBUTES = {"type", "uuid", "productName", "brand", "architecture", "cudaComputeCapability", "driverVersion",
              "cudaDriverVersion", "parentUUID", "profile"}
"""What NVIDIA's plugin publishes under its own domain (issue 55, read from their code)."""

MPS_50_10GI = SharingConfig(Strategy.MPS, None, MpsSettings(50, "10Gi", 10 * 2**30))
TS_LONG = SharingConfig(Strategy.TIME_SLICING, TimeSliceInterval.LONG)
EXPECTED: Mapping[str, Mapping[str, SharingConfig]] = {
    "gpu-test1.yaml": {"single-gpu/gpu": EXCLUSIVE},
    "gpu-test2.yaml": {"single-gpu/gpu": EXCLUSIVE},
    "gpu-test3.yaml": {"single-gpu/gpu": EXCLUSIVE},
    "gpu-test4.yaml": {f"mig-devices/{r}": EXCLUSIVE for r in ("mig-1g-5gb-0", "mig-1g-5gb-1", "mig-2g-10gb",
                                                                "mig-3g-20gb")},
    "gpu-test5.yaml": {"multiple-gpus/ts-gpu": TS_LONG, "multiple-gpus/mps-gpu": MPS_50_10GI},
    "gpu-test6.yaml": {"a100/gpu": TS_LONG},
    "gpu-test-mps.yaml": {"shared-gpu/mps-gpu": MPS_50_10GI},
    "extended-resource-gpu.yaml": {},
    "extended-resource-mig.yaml": {},
    "shares-integer.yaml": {"gpu-1share/gpu": EXCLUSIVE},
    "shares-memory.yaml": {"gpu-4gi/gpu": EXCLUSIVE},
    "shares-unlimited.yaml": {"gpu-unlimited/gpu": EXCLUSIVE},
}
"""File -> ``<claim or template>/<request>`` -> the sharing its devices are prepared with."""
REFUSED = {
    "unknown-field.yaml": "devices.config[0].opaque.parameters.sharing.mpsConfig.activeThreads: unknown field",
    "vfio-config.yaml": "devices.config[0].opaque.parameters.kind: VfioDeviceConfig is NVIDIA's VFIO passthrough",
}
STALE_SELECTORS = {"gpu-test6.yaml": {"index"}}
"""Attributes NVIDIA's example reads that their plugin (and this profile) no longer publishes."""


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def claim_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, the claim spec) of every ResourceClaim and ResourceClaimTemplate."""
    for doc in docs:
        if doc["kind"] == "ResourceClaim":
            yield doc["metadata"]["name"], doc["spec"]
        elif doc["kind"] == "ResourceClaimTemplate":
            yield doc["metadata"]["name"], doc["spec"]["spec"]


def device_type(docs: list[dict[str, Any]], class_name: str) -> str:
    if class_name in CLASSES:
        return CLASSES[class_name]
    [cls] = [d for d in docs if d["kind"] == "DeviceClass" and d["metadata"]["name"] == class_name]
    return "mig" if "type == 'mig'" in cls["spec"]["selectors"][0]["cel"]["expression"] else "gpu"


def sharing_by_request(name: str, spec: dict[str, Any], docs: list[dict[str, Any]]) -> dict[str, SharingConfig]:
    """Each request's sharing, for one device of its class, with the configs as the scheduler copies them."""
    requests = spec["devices"]["requests"]
    targets = [Target(r["name"], f"dev-{i}", device_type(docs, r["exactly"]["deviceClassName"]) == "mig",
                      f"GPU-{i:04d}") for i, r in enumerate(requests)]
    configs = [{**c, "source": "FromClaim"} for c in spec["devices"].get("config") or []]
    sharings = resolve_sharing(configs, targets, DRIVER)
    return {f"{name}/{t.request}": s for t, s in zip(targets, sharings, strict=True)}


ALL = sorted(EXPECTED) + [f"refused/{name}" for name in sorted(REFUSED)]


def test_every_file_is_listed() -> None:
    on_disk = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.yaml")}
    assert on_disk == set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_objects_are_well_formed(name: str) -> None:
    docs = documents(ROOT / name)
    [namespace] = [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"]
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
        if doc["kind"] not in ("Namespace", "DeviceClass"):
            assert doc["metadata"]["namespace"] == namespace, doc["metadata"]


@pytest.mark.parametrize("name", ALL)
def test_classes_and_selectors_are_nvidias(name: str) -> None:
    docs = documents(ROOT / name)
    expressions = [s["cel"]["expression"] for d in docs if d["kind"] == "DeviceClass" for s in d["spec"]["selectors"]]
    for _, spec in claim_specs(docs):
        for request in spec["devices"]["requests"]:
            device_type(docs, request["exactly"]["deviceClassName"])  # a class of NVIDIA's or of the file
            expressions += [s["cel"]["expression"] for s in request["exactly"].get("selectors") or []]
        for constraint in spec["devices"].get("constraints") or []:
            assert constraint["matchAttribute"].removeprefix(f"{DRIVER}/") in ATTRIBUTES
    read: set[str] = set()
    for expression in expressions:
        compile_selector(expression)
        reads = selector_reads(expression)
        assert not reads.whole and not reads.domains
        assert {domain for _, domain, _ in reads.fields} <= {DRIVER}
        read |= {attribute for _, _, attribute in reads.fields}
    assert read - ATTRIBUTES == STALE_SELECTORS.get(name, set())


@pytest.mark.parametrize("name", ALL)
def test_every_container_uses_a_request_of_its_claims(name: str) -> None:
    docs = documents(ROOT / name)
    claims = {n: {r["name"] for r in spec["devices"]["requests"]} for n, spec in claim_specs(docs)}
    for doc in docs:
        pod = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc["spec"] if doc["kind"] == "Pod" \
            else None
        if pod is None:
            continue
        sources = {c["name"]: c.get("resourceClaimTemplateName") or c.get("resourceClaimName")
                   for c in pod.get("resourceClaims") or []}
        assert set(sources.values()) <= set(claims)
        for container in pod["containers"]:
            uses = container["resources"].get("claims") or []
            limits = container["resources"].get("limits") or {}
            assert uses or any(k.startswith("nvidia.com/") for k in limits), container["name"]
            for use in uses:
                assert use["name"] in sources
                assert use.get("request", next(iter(claims[sources[use["name"]]]))) in claims[sources[use["name"]]]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_opaque_configs_give_the_sharing_nvidia_describes(name: str) -> None:
    docs = documents(ROOT / name)
    got: dict[str, SharingConfig] = {}
    for claim_name, spec in claim_specs(docs):
        got |= sharing_by_request(claim_name, spec, docs)
    assert got == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_configs_name_the_field_or_kind(name: str) -> None:
    docs = documents(ROOT / "refused" / name)
    [(claim_name, spec)] = list(claim_specs(docs))
    with pytest.raises(RequestConfigError) as info:
        sharing_by_request(claim_name, spec, docs)
    assert str(info.value).startswith(REFUSED[name])
