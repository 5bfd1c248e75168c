"""``dra-driver explain`` against a fake API server."""

from __future__ import annotations

import io
import json

import pytest
from ctrlfix import add_claim, allocated_status, claim, cluster, sharing_config
from kubefake import FakeKube

from dra_driver.k8s.client import CLAIMS
from dra_driver.tools.explain import command as explain


def run(kube: FakeKube | None, ref: str, output: str = "text", **kw: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = explain.main(ref, output=output, api=kube, out=out, err=err, **kw)  # type: ignore[arg-type]
    return rc, out.getvalue(), err.getvalue()


def test_satisfiable_names_devices_and_node() -> None:
    kube = cluster(gpus=2)
    add_claim(kube, claim(count=2))
    rc, out, err = run(kube, "default/c1")
    assert rc == 0 and err == ""
    assert "would be satisfiable" in out and "node node-a" in out
    assert "gpu.dra-driver.io/node-a/gpu-0 on node node-a" in out


def test_unsatisfiable_renders_the_explanation() -> None:
    kube = cluster(gpus=2)
    add_claim(kube, claim(count=3))
    rc, out, _ = run(kube, "default/c1")
    assert rc == 0
    assert "unsatisfiable: cannot allocate" in out and "need 3" in out
    assert "Claim default/c1: NOT allocated" in out  # the engine's render()


def test_other_claims_count_as_used() -> None:
    kube = cluster(gpus=1)
    other = claim("other")
    other["status"] = allocated_status(["gpu-0"])
    add_claim(kube, other)
    add_claim(kube, claim())
    rc, out, _ = run(kube, "default/c1", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["state"] == "unsatisfiable"


def test_allocated_json() -> None:
    kube = cluster()
    c = claim()
    c["status"] = {**allocated_status(["gpu-1"]), "reservedFor": [{"resource": "pods", "name": "p", "uid": "1"}]}
    add_claim(kube, c)
    rc, out, _ = run(kube, "default/c1", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["state"] == "allocated" and doc["where"] == "node node-a"
    assert doc["results"] == [{"request": "gpu", "driver": "gpu.dra-driver.io", "pool": "node-a",
                               "device": "gpu-1", "node": "node-a"}]
    assert doc["reservedFor"] == ["pods/p"]
    rc, out, _ = run(kube, "default/c1")
    assert "allocated, on node node-a" in out and "reserved for: pods/p" in out


def test_invalid_config_is_reported() -> None:
    kube = cluster()
    add_claim(kube, claim(config=[sharing_config("Bogus")]))
    rc, out, _ = run(kube, "default/c1")
    assert rc == 0 and "invalid configuration" in out and "sharing.strategy" in out


@pytest.mark.parametrize("ref", ["c1", "a/b/c", "/c1", "ns/", "Bad_NS/c1", "ns/UPPER"])
def test_bad_reference(ref: str) -> None:
    rc, out, err = run(FakeKube(), ref)
    assert rc == 1 and out == "" and err.count("\n") == 1 and err.startswith("dra-driver explain: ")


def test_not_found() -> None:
    rc, _, err = run(cluster(), "default/missing")
    assert rc == 1 and err == ("dra-driver explain: ResourceClaim default/missing not found (read 'default/missing' as "
                               "NAMESPACE/CLAIM; a pod is pod/NAME, a claim in another namespace claim/NAME -n "
                               "NAMESPACE)\n")
    rc, _, err = run(cluster(), "claim/missing")
    assert rc == 1 and err == "dra-driver explain: ResourceClaim default/missing not found\n"


def test_unreachable() -> None:
    kube = cluster()
    kube.unreachable = True
    rc, _, err = run(kube, "default/c1")
    assert rc == 1 and "cannot reach the cluster" in err and err.count("\n") == 1


def test_forbidden() -> None:
    from dra_driver.k8s.client import ApiError

    kube = cluster()
    add_claim(kube, claim())
    kube.fail["list:resourceslices"] = ApiError(403, "Forbidden", "resourceslices is forbidden")
    rc, _, err = run(kube, "default/c1")
    assert rc == 1 and "not allowed" in err


def test_read_errors_keep_their_order() -> None:
    """The slices are read in the background, the classes and claims meanwhile: the error reported
    is still the first read's of claim, slices, classes, claims."""
    from dra_driver.k8s.client import ApiError

    order = ("resourceslices", "deviceclasses", "resourceclaims")
    fails = {f"list:{plural}": ApiError(403, "Forbidden", f"{plural} is forbidden") for plural in order}
    for i, first in enumerate(order):
        kube = cluster()
        add_claim(kube, claim())
        kube.fail.update({f"list:{p}": fails[f"list:{p}"] for p in order[i:]})
        rc, _, err = run(kube, "default/c1")
        assert rc == 1 and f"{first} is forbidden" in err and err.count("\n") == 1, (first, err)
    kube = cluster()
    kube.fail.update(fails)
    rc, _, err = run(kube, "default/nope")
    assert rc == 1 and "not found" in err, err


def test_missing_kubeconfig(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    rc, _, err = run(None, "default/c1", kubeconfig="/nonexistent/kubeconfig")
    assert rc == 1 and "kubeconfig /nonexistent/kubeconfig does not exist" in err


def test_garbage_kubeconfig(tmp_path: object) -> None:
    import pathlib

    p = pathlib.Path(str(tmp_path)) / "kc"
    p.write_text("this: is: not: yaml: [")
    rc, _, err = run(None, "default/c1", kubeconfig=str(p))
    assert rc == 1 and err.startswith("dra-driver explain: cannot load cluster configuration")


def test_engine_failure_is_one_line() -> None:
    class Broken:
        def build_inventory(self, slices: object) -> object:
            raise RuntimeError("kaputt")

        def allocated_state(self, claims: object, exclude_uid: object = None) -> object:
            return None

        def resolve(self, *a: object) -> object:
            raise AssertionError

    kube = cluster()
    add_claim(kube, claim())
    rc, out, _ = run(kube, "default/c1", engine=Broken())
    assert rc == 0 and "cannot evaluate" in out and "kaputt" in out


def test_cli_wiring() -> None:
    from dra_driver import cli

    rc = cli.main(["explain", "nope"])
    assert rc == 1


def test_the_driver_name_is_the_one_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver deployed under another name (the chart's ``driverName``) explains its own claims."""
    from dra_driver import cli

    seen: list[str] = []
    monkeypatch.setattr(explain, "main", lambda *args, driver, **kwargs: seen.append(driver) or 0)
    assert cli.main(["explain", "default/c1", "--driver-name", "gpu.example.com"]) == 0
    monkeypatch.setenv("DRIVER_NAME", "gpu.example.org")
    assert cli.kubectl_main(["explain", "default/c1"]) == 0
    assert seen == ["gpu.example.com", "gpu.example.org"]


def test_claim_listing_unused() -> None:
    assert CLAIMS.plural == "resourceclaims"


def test_a_device_taint_rule_counts_and_is_named() -> None:
    # Issue 50: explain decides as the scheduler does, which merges DeviceTaintRules into the devices.
    from dra_driver.k8s.client import DEVICE_TAINT_RULES, ApiError

    kube = cluster(gpus=1)
    add_claim(kube, claim())
    kube.add(DEVICE_TAINT_RULES, {"metadata": {"name": "drain-node-a"}, "spec": {
        "deviceSelector": {"pool": "node-a"}, "taint": {"key": "drain", "effect": "NoSchedule"}}})
    rc, out, _ = run(kube, "default/c1")
    assert rc == 0 and "unsatisfiable" in out
    assert "taint drain=:NoSchedule from DeviceTaintRule drain-node-a not tolerated" in out
    # A server without them (before 1.37), or a caller who may not read them: none.
    for status in (404, 403):
        kube.fail["list:devicetaintrules"] = ApiError(status, "NotFound", "no")
        rc, out, _ = run(kube, "default/c1")
        assert rc == 0 and "would be satisfiable" in out, status
