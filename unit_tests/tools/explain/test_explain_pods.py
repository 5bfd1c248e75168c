"""``dra-driver explain pod/NAME``, ``-n NS``, ``-A`` and kubectl's flags, against a fake API server."""

from __future__ import annotations

import io
import json
import pathlib
from typing import Any

import pytest
import yaml
from ctrlfix import FakeClock, add_claim, add_pod, allocated_status, claim, cluster, device_class, pod, settings, step
from kubefake import FakeKube

from dra_driver import cli
from dra_driver.allocator.resolve import Engine
from dra_driver.controller.reconciler import Controller
from dra_driver.k8s.claims import POD_CLAIM_NAME_ANNOTATION
from dra_driver.k8s.client import CLAIMS, DEVICE_CLASSES, PODS, ApiError, ListResult, Resource, kubeconfig_context
from dra_driver.k8s.quarantine import Undecodable
from dra_driver.tools.explain import command as explain
from dra_driver.tools.explain.pending import NOT_EXPLAINED, NOTED_CLAIMS, pending_report, render_pending
from dra_driver.tools.explain.targets import Kind, Target, TargetError, parse_target

OTHER = "tpu.example.com"


def run(kube: FakeKube | None, target: str | None, output: str = "text", **kw: Any) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = explain.main(target, output=output, api=kube, out=out, err=err, **kw)  # type: ignore[arg-type]
    return rc, out.getvalue(), err.getvalue()


def failed(rc: int, out: str, err: str) -> str:
    """The one line a failure prints, after checking that it is one: exit 1, nothing on stdout."""
    assert rc == 1 and out == "" and err.count("\n") == 1 and err.startswith("dra-driver explain: "), (rc, out, err)
    assert "Traceback" not in err
    return err


def template_pod(kube: FakeKube, name: str = "p", count: int = 3, ns: str = "default") -> str:
    generated = f"{name}-gpu-x1"
    add_claim(kube, claim(generated, count=count, ns=ns, annotations={POD_CLAIM_NAME_ANNOTATION: "gpu"}))
    add_pod(kube, pod(name, generated, ns=ns, via_template=True))
    return generated


class TestTargets:
    @pytest.mark.parametrize(("text", "ns", "all_ns", "want"), [
        ("pod/p", None, False, Target(Kind.POD, "ctx-ns", "p")),
        ("pods/p", "team", False, Target(Kind.POD, "team", "p")),
        ("po/p", None, False, Target(Kind.POD, "ctx-ns", "p")),
        ("claim/c", "team", False, Target(Kind.CLAIM, "team", "c")),
        ("resourceclaim.resource.k8s.io/c", None, False, Target(Kind.CLAIM, "ctx-ns", "c")),
        ("team/c", None, False, Target(Kind.CLAIM, "team", "c", namespace_form=True)),
        ("team/c", "team", False, Target(Kind.CLAIM, "team", "c", namespace_form=True)),
        (["pod", "p"], None, False, Target(Kind.POD, "ctx-ns", "p")),
        (["resourceclaims", "c"], "team", False, Target(Kind.CLAIM, "team", "c")),
        (None, None, False, Target(Kind.PENDING, "ctx-ns")),
        (None, "team", False, Target(Kind.PENDING, "team")),
        (None, None, True, Target(Kind.PENDING, None)),
    ])
    def test_read_as_kubectl_reads_them(self, text: str | list[str] | None, ns: str | None, all_ns: bool, want: Target) -> None:
        assert parse_target(text, namespace=ns, all_namespaces=all_ns, default_namespace="ctx-ns") == want

    @pytest.mark.parametrize(("text", "ns", "all_ns", "says"), [
        ("c1", None, False, "name a pod"),
        ("a/b/c", None, False, "name a pod"),
        ("pod/", None, False, "name a pod"),
        ("pod/p", None, True, "takes no name"),
        (None, "team", True, "leave out -n"),
        ("team/c", "other", False, "-n says 'other'"),
        ("Bad_NS/c", None, False, "invalid namespace"),
        ("pod/UPPER", None, False, "invalid pod name"),
        (None, "Bad_NS", False, "invalid namespace"),
        ("deploy/x", None, False, "unknown resource type 'deploy'"),
        ("deployments.apps/x", None, False, "explain takes pod, pods, po, claim"),
        (["deploy", "x"], None, False, "unknown resource type 'deploy'"),
        (["pod", "a", "b"], None, False, "one pod or claim at a time"),
        (["pod", "team/a"], None, False, "one pod or claim at a time"),
    ])
    def test_what_cannot_be_read_says_why(self, text: str | list[str] | None, ns: str | None, all_ns: bool, says: str) -> None:
        with pytest.raises(TargetError, match=says):
            parse_target(text, namespace=ns, all_namespaces=all_ns, default_namespace="default")


class TestPod:
    def test_a_template_claim_by_the_pods_name_for_it(self) -> None:
        kube = cluster(gpus=2)
        template_pod(kube)
        rc, out, err = run(kube, "pod/p")
        assert rc == 0 and err == ""
        lines = out.splitlines()
        assert lines[0] == "Pod default/p (Pending): 1 claim(s), 1 cannot be allocated"
        assert lines[1].startswith("claim gpu (p-gpu-x1): cannot be allocated: ") and "need 3" in lines[1]
        assert lines[2:4] == ["", "  Claim default/p-gpu-x1: NOT allocated"] and "rules: kube-scheduler" in out
        assert "(uid " not in out and out.count("need 3") == 2  # the claim line, then the engine's report
        doc = json.loads(run(kube, "pod/p", "json")[1])
        [entry] = doc["claims"]
        assert entry["podClaim"] == "gpu" and entry["template"] == "tmpl" and entry["state"] == "unsatisfiable"
        assert doc["pod"] == "default/p" and doc["phase"] == "Pending"

    def test_every_claim_of_the_pod(self) -> None:
        kube = cluster(gpus=2)
        c = claim("ok")
        c["status"] = {**allocated_status(["gpu-1"]), "devices": [{
            "driver": "gpu.dra-driver.io", "pool": "node-a", "device": "gpu-1",
            "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared"}], "data": {"uuid": "GPU-1"}}]}
        add_claim(kube, c)
        add_claim(kube, claim("big", count=5))
        p = pod("p", "ok")
        p["spec"]["resourceClaims"] += [{"name": "more", "resourceClaimName": "big"},
                                        {"name": "later", "resourceClaimTemplateName": "tmpl2"}]
        add_pod(kube, p)
        rc, out, _ = run(kube, "pod/p", namespace="default")
        assert rc == 0
        assert "claim gpu (ok): allocated" in out and "claim more (big): cannot be allocated: " in out
        assert "claim later (?): not created yet: not created yet from ResourceClaimTemplate tmpl2" in out
        assert "gpu.dra-driver.io/node-a/gpu-1 on node node-a" in out  # the allocated claim's device and node
        assert "Ready=True (Prepared); uuid=GPU-1" in out  # and its device status

    def test_unknown_pod(self) -> None:
        err = failed(*run(cluster(), "pod/nope", namespace="team"))
        assert err == "dra-driver explain: pod team/nope not found\n"

    def test_a_pod_without_claims(self) -> None:
        kube = cluster()
        p = pod("plain", "x")
        p["spec"]["resourceClaims"] = []
        add_pod(kube, p)
        assert "pod default/plain has no resource claims" in failed(*run(kube, "pod/plain"))

    def test_a_pod_of_another_driver_only(self) -> None:
        kube = cluster()
        kube.add(DEVICE_CLASSES, device_class("tpu", driver=OTHER))
        add_claim(kube, claim("t", cls="tpu"))
        add_pod(kube, pod("p", "t"))
        assert f"pod default/p has no claim of gpu.dra-driver.io: its claims are for {OTHER}" in failed(*run(kube, "pod/p"))

    def test_forbidden_namespace(self) -> None:
        kube = cluster()
        kube.fail["get:pods"] = ApiError(403, "Forbidden", 'pods "p" is forbidden: cannot get pods in the namespace "secret"')
        err = failed(*run(kube, "pod/p", namespace="secret"))
        assert "not allowed" in err and 'namespace "secret"' in err


class TestClaim:
    def test_claim_slash_name_and_the_old_form(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim("c1", count=3, ns="team"))
        assert run(kube, "claim/c1", namespace="team")[1] == run(kube, "team/c1")[1]

    def test_a_claim_of_another_driver(self) -> None:
        kube = cluster()
        kube.add(DEVICE_CLASSES, device_class("tpu", driver=OTHER))
        add_claim(kube, claim("t", cls="tpu"))
        err = failed(*run(kube, "claim/t"))
        assert err == f"dra-driver explain: ResourceClaim default/t is a claim of {OTHER}, not of gpu.dra-driver.io\n"


class NoResolving(Engine):
    def resolve(self, *a: Any, **kw: Any) -> Any:
        raise AssertionError("a listing reads what the controller wrote; it resolves nothing")


def explained_cluster() -> FakeKube:
    """Pending claims in two namespaces, explained by the controller: three that need 3 GPUs of 2,
    one that needs 5, one satisfiable, one of another driver."""
    kube = cluster(gpus=2)
    kube.add(DEVICE_CLASSES, device_class("tpu", driver=OTHER))
    for i in range(2):
        template_pod(kube, f"a{i}")
    template_pod(kube, "b0", ns="team")
    template_pod(kube, "big", count=5)
    add_claim(kube, claim("fits", count=1))
    add_pod(kube, pod("fits", "fits"))
    add_claim(kube, claim("t", cls="tpu"))
    add_pod(kube, pod("tpu", "t"))
    step(Controller(kube, settings(), clock=FakeClock(), sleep=lambda _s: None))
    return kube


class UndecodableItems(FakeKube):
    """The cluster's lists, with one claim and one class the API server served but that did not decode."""

    def __init__(self, kube: FakeKube) -> None:
        self.__dict__.update(kube.__dict__)

    def list(self, res: Resource, **kw: Any) -> ListResult:
        listed = super().list(res, **kw)
        bad = {CLAIMS: Undecodable({"metadata": {"name": "bad", "namespace": "team"}},
                                   "str is not valid UTF-8: surrogates not allowed"),
               DEVICE_CLASSES: Undecodable({"metadata": {"name": "odd"}}, "unexpected character")}.get(res)
        return ListResult(listed.items, listed.resource_version, [bad] if bad else [])


class TestPending:
    def test_a_namespace_grouped_by_reason_from_what_the_controller_wrote(self) -> None:
        kube = explained_cluster()
        rc, out, err = run(kube, None, namespace="default", engine=NoResolving())
        assert rc == 0 and err == ""
        lines = out.splitlines()
        assert lines[0] == "4 pending claim(s) in namespace default, 3 reason(s):"
        assert lines[2].startswith("Unsatisfiable (2): cannot allocate") and "need 3" in lines[2]
        assert lines[3:5] == ["  default/a0-gpu-x1", "  default/a1-gpu-x1"]
        assert lines[6].startswith("Unsatisfiable (1): ") and "need 5" in lines[6]
        assert lines[9].startswith(f"{NOT_EXPLAINED} (1): no explanation from the controller") and lines[10] == "  default/fits"
        assert "default/t" not in out  # another driver's

    def test_all_namespaces(self) -> None:
        kube = explained_cluster()
        doc = json.loads(run(kube, None, "json", all_namespaces=True, engine=NoResolving())[1])
        assert doc["namespace"] is None and doc["pending"] == 5
        first = doc["groups"][0]
        assert first["reason"] == "Unsatisfiable"
        assert [r["claim"] for r in first["claims"]] == ["default/a0-gpu-x1", "default/a1-gpu-x1", "team/b0-gpu-x1"]

    def test_wide_names_the_waiting_pods_and_yaml_is_the_same_document(self) -> None:
        kube = explained_cluster()
        rc, out, _ = run(kube, None, "wide", namespace="team")
        assert rc == 0 and "  team/b0-gpu-x1  pods: b0 (claim gpu)" in out
        as_yaml = yaml.safe_load(run(kube, None, "yaml", namespace="team")[1])
        assert as_yaml == json.loads(run(kube, None, "json", namespace="team")[1])

    def test_the_claims_as_read_give_the_report_the_whole_claims_give(self) -> None:
        # The list is read through the reduced schema (protobuf, or JSON reduced alike): the report
        # must not change with it, for every output.
        kube = explained_cluster()
        whole = kube.list(CLAIMS).items
        as_read = kube.list(CLAIMS, reduced=NOTED_CLAIMS).items
        assert as_read != whole and all("managedFields" not in c["metadata"] for c in as_read)
        classes = kube.list(DEVICE_CLASSES).items
        pods = kube.list(PODS).items
        for wide in (None, pods):
            got = pending_report(as_read, classes, wide, driver="gpu.dra-driver.io", namespace=None)
            assert got == pending_report(whole, classes, wide, driver="gpu.dra-driver.io", namespace=None)
            assert got["pending"] == 5 and render_pending(got).count("\n") > 5

    def test_nothing_pending(self) -> None:
        kube = cluster()
        c = claim()
        c["status"] = allocated_status(["gpu-0"])
        kube.add(CLAIMS, c)
        assert run(kube, None) == (0, "no pending claims in namespace default\n", "")

    def test_a_claim_or_class_no_one_can_decode_is_named_not_left_out_unsaid(self) -> None:
        kube = UndecodableItems(explained_cluster())
        rc, out, err = run(kube, None, all_namespaces=True)
        assert rc == 0 and err == "", err
        assert out.rstrip("\n").endswith(
            "2 object(s) could not be read and are left out:\n"
            "  ResourceClaim team/bad: str is not valid UTF-8: surrogates not allowed\n"
            "  DeviceClass odd: unexpected character")
        assert json.loads(run(kube, None, "json", all_namespaces=True)[1])["unreadable"] == [
            "ResourceClaim team/bad: str is not valid UTF-8: surrogates not allowed", "DeviceClass odd: unexpected character"]
        nothing = UndecodableItems(cluster())
        assert run(nothing, None)[1].startswith("no pending claims in namespace default\n\n2 object(s) could not be read")

    def test_forbidden(self) -> None:
        kube = cluster()
        kube.fail["list:resourceclaims"] = ApiError(403, "Forbidden", "resourceclaims is forbidden in the namespace \"x\"")
        assert "not allowed" in failed(*run(kube, None, namespace="x"))


KUBECONFIG = """
apiVersion: v1
kind: Config
current-context: main
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts:
- {name: main, context: {cluster: c, user: u, namespace: team}}
- {name: plain, context: {cluster: c, user: u}}
"""


class TestKubeconfig:
    def test_the_contexts_namespace(self, tmp_path: pathlib.Path) -> None:
        path = tmp_path / "config"
        path.write_text(KUBECONFIG)
        assert kubeconfig_context(str(path)) == ("main", "team")
        assert kubeconfig_context(str(path), "plain") == ("plain", None)

    def test_a_context_that_does_not_exist(self, tmp_path: pathlib.Path) -> None:
        path = tmp_path / "config"
        path.write_text(KUBECONFIG)
        err = failed(*run(None, "pod/p", kubeconfig=str(path), context="nope"))
        assert err == f"dra-driver explain: context 'nope' not found in kubeconfig {path}\n"


class TestCommand:
    def test_kubectl_flags(self, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
        path = tmp_path / "config"
        path.write_text(KUBECONFIG)
        assert cli.kubectl_main(["explain", "pod/p", "-n", "team", "--kubeconfig", str(path), "--context", "nope"]) == 1
        assert "context 'nope' not found" in capsys.readouterr().err
        assert cli.main(["explain", "-A", "-n", "team", "--kubeconfig", str(path)]) == 1
        assert "leave out -n" in capsys.readouterr().err

    def test_the_plugin_offers_only_what_a_person_runs(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as exit_:
            cli.kubectl_main(["controller"])
        assert exit_.value.code == 2 and "kubectl dra" in capsys.readouterr().err
