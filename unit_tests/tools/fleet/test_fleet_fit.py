"""`fit` against a fake API server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from ctrlfix import CLASS, DRIVER, add_claim, add_pod, allocated_status, claim, device_class, pod
from fleetfix import A100, H100, fleet, run, shipped_classes, template
from kubefake import FakeKube

from dra_driver.allocator.resolve import Engine
from dra_driver.k8s.client import CLAIM_TEMPLATES, DEVICE_CLASSES, SLICES, ApiError
from dra_driver.tools.fleet.fit import workload_fitter
from dra_driver.tools.migrate.workloads import FitAsk
from e2e.generators.fleet import plugin_slices

# --- fit -----------------------------------------------------------------------------------------


def test_fit_counts_what_is_free_and_names_the_first_that_does_not_fit() -> None:
    kube = fleet()
    kube.add(CLAIM_TEMPLATES, template())
    rc, out, _ = run(kube, "fit", "--template", "one-gpu", "--count", "10", "-o", "json")
    doc = json.loads(out)
    # free: node-a gpu-3 and the shareable gpu-1 (a whole-device request cannot share it), node-b's two
    assert rc == 0 and doc["fits"] == 3 and doc["nodes"] == {"node-a": 1, "node-b": 2}
    assert doc["models"] == {H100: 1, A100: 2}
    assert doc["firstFailure"]["try"] == 4 and doc["firstFailure"]["state"] == "unsatisfiable"
    assert doc["rules"].startswith("kube-scheduler 1.37")
    rc, out, _ = run(kube, "fit", "--template", "default/one-gpu", "--count", "10")
    assert rc == 0 and out.startswith("3 of 10 more of ResourceClaimTemplate default/one-gpu fit now")
    assert "try 4 does not fit: claim default/one-gpu-fit-3" in out and "unsatisfiable: " in out


def test_fit_a_claim_file(tmp_path: Path) -> None:
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(claim("two", count=2) | {"kind": "ResourceClaim"}))
    rc, out, _ = run(fleet(), "fit", "-f", str(path), "--count", "2", "-o", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["fits"] == 1 and doc["nodes"] == {"node-b": 1}
    rc, out, _ = run(fleet(), "fit", "-f", "-", "-o", "json", stdin=json.dumps(template()))
    assert rc == 0 and json.loads(out)["fits"] == 1


def test_fit_a_pod_puts_all_its_claims_on_one_node() -> None:
    kube = fleet()
    kube.add(CLAIM_TEMPLATES, template())
    two = pod("trainer", "", via_template=True)
    two["spec"]["resourceClaims"] = [{"name": "a", "resourceClaimTemplateName": "one-gpu"},
                                     {"name": "b", "resourceClaimTemplateName": "one-gpu"}]
    add_pod(kube, two)
    rc, out, _ = run(kube, "fit", "pod/trainer", "--count", "3", "-o", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["fits"] == 1 and doc["nodes"] == {"node-b": 1} and doc["models"] == {A100: 2}
    assert doc["firstFailure"]["try"] == 2


# --- a workload, for migrate ---------------------------------------------------------------------


def ask(pods: int | None, cls: str = CLASS, count: int = 1, classes: tuple[dict[str, Any], ...] = ()) -> FitAsk:
    return FitAsk({"kind": "Deployment", "metadata": {"name": "serve", "namespace": "ml"}},
                  ({"name": "gpu-0", "exactly": {"deviceClassName": cls, "count": count}},), pods, classes)


def test_a_workloads_pods_fit_or_not_and_where() -> None:
    fit = workload_fitter(fleet(), driver=DRIVER)
    # as the fit above: node-a's gpu-3 and node-b's two A100s are free for a whole GPU
    assert fit(ask(3)) == "yes, all 3 pods, on node-a (1), node-b (2)"
    four = fit(ask(4))
    assert four.startswith("no: 3 of 4 pods fit (on node-a (1), node-b (2)); the next: cannot allocate"), four
    assert fit(ask(1, count=2)) == "yes, on node-b (1)"
    assert fit(ask(1, count=3)).startswith("no: cannot allocate"), "none fits: no count of pods that did"
    assert fit(ask(0)) == "no pods to fit (0 replicas)"


def test_a_daemonsets_pod_is_tried_on_each_node() -> None:
    fit = workload_fitter(fleet(), driver=DRIVER)
    assert fit(ask(None)) == "one pod on each node: fits on 2 of 3 nodes (node-a, node-b)"
    assert fit(ask(None, count=2)) == "one pod on each node: fits on 1 of 3 nodes (node-b)"


def test_a_class_migrate_would_create_is_fitted_before_it_exists() -> None:
    planned = device_class("nvidia-gpu.gpu.dra-driver.io")
    planned["spec"]["selectors"].append({"cel": {"expression": f'device.attributes["{DRIVER}"].productName == "{H100}"'}})
    fit = workload_fitter(fleet(), driver=DRIVER)
    assert fit(ask(1, "nvidia-gpu.gpu.dra-driver.io", classes=(planned,))) == "yes, on node-a (1)"
    assert fit(ask(2, "nvidia-gpu.gpu.dra-driver.io", classes=(planned,))).startswith("no: 1 of 2 pods fit")
    missing = fit(ask(1, "nvidia-gpu.gpu.dra-driver.io"))
    assert missing.startswith("no: ") and "nvidia-gpu.gpu.dra-driver.io not found" in missing, missing


def test_a_fleet_that_cannot_be_read_is_said_and_read_once() -> None:
    kube = fleet()
    kube.fail["list:resourceslices"] = ApiError(403, "Forbidden", "resourceslices is forbidden")
    fit = workload_fitter(kube, driver=DRIVER)
    assert fit(ask(1)) == fit(ask(2)) == "not computed: not allowed: 403 Forbidden: resourceslices is forbidden"
    reads = [c for c in kube.calls if c[0] == "list" and c[1] == SLICES.plural]
    assert len(reads) == 1, reads
# --- each try allocated without its explanation gives what explaining every try gave ----------------


class Explaining(Engine):
    """The engine as fit used it before it allocated without explaining: every try through
    the controller's whole evaluation (resolve and its explanation)."""

    def __init__(self) -> None:
        self.allocations = 0

    def allocate(self, *_: Any, **__: Any) -> None:
        self.allocations += 1
        return None


class Counting(Engine):
    def __init__(self) -> None:
        self.resolves = 0

    def resolve(self, *args: Any, **kwargs: Any) -> Any:
        self.resolves += 1
        return super().resolve(*args, **kwargs)


def _fleet_with_mig() -> FakeKube:
    """Six nodes of the plugin's own slices (two with dynamic MIG), the shipped DeviceClasses, and
    claims holding GPUs, a MIG partition and two shares."""
    kube = FakeKube()
    for s in plugin_slices(6, mig_nodes=2):
        kube.add(SLICES, s)
    for doc in shipped_classes():
        kube.add(DEVICE_CLASSES, doc)
    for i, (node, device) in enumerate([("gpu-node-3", "gpu-0"), ("gpu-node-3", "gpu-1"), ("gpu-node-4", "gpu-5"),
                                        ("gpu-node-1", "gpu-0-mig-3g40gb-0")]):
        held = claim(f"held-{i}")
        held["status"] = allocated_status([device], node=node)
        add_claim(kube, held)
    return kube


def _request(cls: str, selector: str | None = None, count: int = 1, **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": "gpu", "exactly": exactly, **extra}


SHAPES: dict[str, dict[str, Any]] = {
    "any-gpu": {"requests": [_request(f"gpu.{DRIVER}")]},
    "h100": {"requests": [_request(f"gpu.{DRIVER}", f'device.attributes["{DRIVER}"].productName.startsWith("NVIDIA H100")')]},
    "mig-1g": {"requests": [_request(f"mig.{DRIVER}", f'device.attributes["{DRIVER}"].profile.startsWith("1g.")')]},
    "two-on-one-pcie-root": {"requests": [_request(f"gpu.{DRIVER}", count=2)],
                        "constraints": [{"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]},
    "cel-error": {"requests": [_request(f"gpu.{DRIVER}", f'device.attributes["{DRIVER}"].nope == "x"')]},
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_template_fits_as_when_every_try_was_explained(shape: str) -> None:
    kube = _fleet_with_mig()
    kube.add(CLAIM_TEMPLATES, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                               "metadata": {"name": shape, "namespace": "default"}, "spec": {"spec": {"devices": SHAPES[shape]}}})
    explaining = Explaining()
    rc, before, _ = run(kube, "fit", "--template", shape, "--count", "200", "-o", "json", engine=explaining)
    counting = Counting()
    rc2, now, _ = run(kube, "fit", "--template", shape, "--count", "200", "-o", "json", engine=counting)
    assert rc == rc2 == 0 and json.loads(now) == json.loads(before)
    doc = json.loads(now)
    assert explaining.allocations == doc["fits"] + ("firstFailure" in doc)
    # Only the try that does not fit is explained (a CEL error fails the first).
    assert counting.resolves == ("firstFailure" in doc)
    if shape != "cel-error":
        assert doc["fits"] > 10 and "firstFailure" in doc


def test_the_fixture_fleet_and_a_pod_fit_as_when_every_try_was_explained() -> None:
    kube = fleet()
    kube.add(CLAIM_TEMPLATES, template())
    two = pod("trainer", "", via_template=True)
    two["spec"]["resourceClaims"] = [{"name": "a", "resourceClaimTemplateName": "one-gpu"},
                                     {"name": "b", "resourceClaimTemplateName": "one-gpu"}]
    add_pod(kube, two)
    for argv in (("fit", "--template", "one-gpu", "--count", "10"), ("fit", "pod/trainer", "--count", "3")):
        explained = run(kube, *argv, "-o", "json", engine=Explaining())
        assert run(kube, *argv, "-o", "json") == explained
        assert json.loads(explained[1])["fits"] >= 1


class _Forgets(dict[Any, Any]):
    """An inventory's node lists that keeps none (each asked for is computed anew)."""

    stored = 0

    def __setitem__(self, key: Any, value: Any) -> None:
        type(self).stored += 1


def test_the_node_lists_kept_on_the_inventory_fit_as_those_computed_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = _fleet_with_mig()  # dynamic MIG: the request's devices are several groups, not one
    kube.add(CLAIM_TEMPLATES, template(cls="gpu.gpu.dra-driver.io"))
    argv = ("fit", "--template", "one-gpu", "--count", "60", "-o", "json")
    rc, kept, _ = run(kube, *argv)
    built = Engine.build_inventory

    def forgetting(self: Engine, *args: Any, **kwargs: Any) -> Any:
        inventory = built(self, *args, **kwargs)
        inventory.visits = _Forgets()
        return inventory

    monkeypatch.setattr(Engine, "build_inventory", forgetting)
    assert run(kube, *argv) == (rc, kept, "")
    fits = json.loads(kept)["fits"]
    assert rc == 0 and 0 < fits < 60 and _Forgets.stored >= fits
