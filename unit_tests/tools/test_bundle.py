"""dra-driver debug-bundle: what goes in, what is redacted, and the archive itself."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from kubefake import FakeKube

from dra_driver.allocator.resolve import Engine
from dra_driver.k8s.client import CLAIMS, DEVICE_CLASSES, EVENTS, LEASES, NODES, PODS, SLICES
from dra_driver.node.prepare.metadata import HOST_SUBDIR
from dra_driver.ondisk import CHECKPOINT_FILE
from dra_driver.tools import bundle as b

DRIVER = "gpu.dra-driver.io"
JWT = "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLWJ5dGVz"


def pod(name: str, claims: bool = True) -> dict[str, object]:
    spec: dict[str, object] = {"containers": [{"name": "c", "image": "busybox", "env": [
        {"name": "PASSWORD", "value": "hunter2"},
        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}
    if claims:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "c1"}]
    return {"metadata": {"name": name, "namespace": "ns", "annotations": {
        "kubectl.kubernetes.io/last-applied-configuration": '{"env":[{"value":"hunter2"}]}',
        "note": f"Authorization: Bearer {JWT}"}, "managedFields": [{"manager": "kubectl"}]}, "spec": spec}


def test_redaction_keeps_names_and_drops_values() -> None:
    out = b.redact(pod("p"))
    text = json.dumps(out)
    assert "hunter2" not in text and JWT not in text and "managedFields" not in text
    env = out["spec"]["containers"][0]["env"]
    assert env[0] == {"name": "PASSWORD", "value": b.REDACTED}
    assert env[1]["valueFrom"]["secretKeyRef"]["name"] == "s", "where a value comes from stays"
    assert out["metadata"]["annotations"]["note"] == b.REDACTED, "not the driver's annotation"
    assert b.redact({"message": f"Authorization: Bearer {JWT}"}) == {"message": f"Authorization: Bearer {b.REDACTED}"}
    assert b.redact({"token": "abc", "clientSecret": "x", "tokens": 3}) == {
        "token": b.REDACTED, "clientSecret": b.REDACTED, "tokens": 3}


def test_env_values_are_scrubbed_from_every_file() -> None:
    values = b.env_values([pod("p")])
    assert values == {"hunter2"}
    got = b.Bundle(secrets=values)
    got.files["node/n/metrics.txt"] = b"copied hunter2 here"
    got.add_json("cluster/x.json", {"annotations": {"seen": 'env {"PASSWORD": "hunter2"}'}})
    assert all(b"hunter2" not in data for data in got.scrubbed().values())
    assert b.scrub('a "q\\"uote" b', {'q"uote'}) == "a \"<redacted>\" b"


def test_related_events_are_about_collected_objects_nodes_or_ours() -> None:
    claim = {"kind": "ResourceClaim", "metadata": {"name": "c1", "namespace": "ns", "uid": "u1"}}
    events = [
        {"regarding": {"kind": "ResourceClaim", "name": "c1", "namespace": "ns", "uid": "u1"}, "reason": "A"},
        {"regarding": {"kind": "Node", "name": "n1"}, "reason": "B"},
        {"regarding": {"kind": "Pod", "name": "x", "namespace": "other"}, "reason": "C"},
        {"regarding": {"kind": "Node", "name": "n2"}, "reportingController": "gpu.dra-driver.io/kubelet-plugin",
         "reason": "D"},
    ]
    assert [e["reason"] for e in b.related_events(events, [claim], ["n1"])] == ["A", "B", "D"]


def test_collect_cluster_from_the_api(tmp_path: Path) -> None:
    api = FakeKube()
    api.add(SLICES, {"metadata": {"name": "s1"}, "spec": {"driver": DRIVER, "nodeName": "n1", "pool": {
        "name": "n1", "generation": 1, "resourceSliceCount": 1}, "devices": []}})
    api.add(SLICES, {"metadata": {"name": "other"}, "spec": {"driver": "other.example.com"}})
    api.add(DEVICE_CLASSES, {"metadata": {"name": "gpu.gpu.dra-driver.io"}, "spec": {}})
    api.add(CLAIMS, {"metadata": {"name": "c1", "namespace": "ns"}, "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu.dra-driver.io"}}]}}})
    api.add(PODS, pod("user"))
    api.add(PODS, pod("unrelated", claims=False))
    api.add(NODES, {"metadata": {"name": "n1"}, "status": {"nodeInfo": {"kubeletVersion": "v1.37.2"},
                                                          "addresses": [{"address": "10.0.0.1"}]}})
    api.add(LEASES, {"metadata": {"name": "dra-driver-controller", "namespace": "dra-driver"},
                     "spec": {"holderIdentity": "ctrl-0"}})
    api.add(EVENTS, {"metadata": {"name": "e", "namespace": "ns"}, "reason": "Unsatisfiable",
                     "regarding": {"kind": "ResourceClaim", "name": "c1", "namespace": "ns"}})
    got = b.Bundle()
    b.collect_cluster(got, api, DRIVER, Engine(), ["n1"])
    files = {k: json.loads(v) for k, v in got.files.items()}
    assert [s["metadata"]["name"] for s in files["cluster/resourceslices.json"]] == ["s1"]
    assert [p["metadata"]["name"] for p in files["cluster/pods.json"]] == ["user"]
    assert files["cluster/controller-leader-lease.json"][0]["spec"]["holderIdentity"] == "ctrl-0"
    assert files["cluster/nodes.json"] == [{"name": "n1", "labels": {}, "nodeInfo": {"kubeletVersion": "v1.37.2"}}]
    assert files["cluster/explanations.json"]["ns/c1"]["state"] == "unsatisfiable"
    assert [e["reason"] for e in files["cluster/events.json"]] == ["Unsatisfiable"]
    assert not got.problems


def test_a_forbidden_list_is_named_not_fatal() -> None:
    from dra_driver.k8s.client import ApiError

    api = FakeKube()
    api.fail["list:pods"] = ApiError(403, "Forbidden", "pods is forbidden")
    got = b.Bundle()
    b.collect_cluster(got, api, DRIVER, Engine(), [])
    assert got.problems == ["pods: 403 Forbidden: pods is forbidden"]
    assert "cluster/resourceclaims.json" in got.files and "cluster/pods.json" not in got.files


def test_node_files_and_archive(tmp_path: Path) -> None:
    state, cdi = tmp_path / "state", tmp_path / "cdi"
    state.mkdir()
    cdi.mkdir()
    (state / "checkpoint.json").write_text("{}")
    (state / "checkpoint.json.corrupt-20261123T000000Z").write_text("garbage")
    (state / ".checkpoint.json.tmp-abcd").write_text("half")
    (cdi / f"k8s.{DRIVER}-claim_0b1c2d3e-0000-4000-8000-000000000001.json").write_text('{"kind":"k8s.x/claim"}')
    (cdi / "k8s.other.example.com-claim_x.json").write_text("{}")
    (cdi / f"{DRIVER}_metadata_0b1c2d3e-0000-4000-8000-000000000001_gpu.json").write_text('{"kind":"x/metadata"}')
    (state / HOST_SUBDIR).mkdir()
    (state / HOST_SUBDIR / "0b1c2d3e-0000-4000-8000-000000000001_gpu.json").write_text('{"requests":[]}')
    got = b.Bundle()
    src = b.NodeSources("n1", state, cdi, "http://127.0.0.1:1/metrics")
    b.collect_node(got, src, DRIVER, fetch=lambda url: b"dra_driver_plugin_prepared_claims 1.0\n")
    assert sorted(got.files) == [
        "node/n1/cdi/gpu.dra-driver.io_metadata_0b1c2d3e-0000-4000-8000-000000000001_gpu.json",
        "node/n1/cdi/k8s.gpu.dra-driver.io-claim_0b1c2d3e-0000-4000-8000-000000000001.json",
        "node/n1/metrics.txt",
        "node/n1/state/checkpoint.json",
        "node/n1/state/checkpoint.json.corrupt-20261123T000000Z",
        "node/n1/state/device-metadata/0b1c2d3e-0000-4000-8000-000000000001_gpu.json",
    ]
    assert b.METADATA_SUBDIR == HOST_SUBDIR
    got.add_json("manifest.json", {"x": 1})
    out = tmp_path / "bundle.tar.gz"
    assert b.write_bundle(got, "top", str(out)) == str(out)
    assert out.stat().st_mode & 0o777 == 0o600
    with tarfile.open(out) as tar:
        names = tar.getnames()
        assert "top/manifest.json" in names and all(n.startswith("top/") for n in names)


def test_node_sources_missing_are_named(tmp_path: Path) -> None:
    got = b.Bundle()

    def refuse(url: str) -> bytes:
        raise OSError("connection refused")

    b.collect_node(got, b.NodeSources("n1", tmp_path / "nope", tmp_path / "nope", "http://x/metrics"), DRIVER,
                   fetch=refuse)
    assert len(got.problems) == 3 and "connection refused" in got.problems[2]


def test_main_without_a_cluster_still_writes_the_node_part(tmp_path: Path, monkeypatch: object) -> None:
    import pytest

    mp: pytest.MonkeyPatch = monkeypatch  # type: ignore[assignment]
    mp.delenv("KUBECONFIG", raising=False)
    mp.setenv("HOME", str(tmp_path))
    out = tmp_path / "b.tar.gz"
    (tmp_path / CHECKPOINT_FILE).write_text("{}")
    rc = b.main(kubeconfig=str(tmp_path / "missing"), output=str(out), node="n1", state_dir=str(tmp_path),
                cdi_root=str(tmp_path), metrics_url="http://127.0.0.1:9/metrics")
    assert rc == 0
    with tarfile.open(out) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("manifest.json"))
        doc = json.load(io.BytesIO(tar.extractfile(member).read()))  # type: ignore[union-attr]
    assert any("does not exist" in p for p in doc["notCollected"])
    assert doc["versions"]["dra-driver"] and doc["node"] == "n1"


def test_a_claim_that_cannot_be_decoded_is_named_and_the_rest_collected() -> None:
    from typing import Any

    from dra_driver.k8s.client import ListResult
    from dra_driver.k8s.quarantine import Undecodable

    api = FakeKube()
    api.add(CLAIMS, {"metadata": {"name": "c1", "namespace": "ns", "uid": "u1"}})
    listed = api.list
    bad = Undecodable({"metadata": {"name": "bad", "namespace": "ns", "uid": "u2"}, "status": {}},
                      "str is not valid UTF-8: surrogates not allowed")

    def with_bad(res: Any, **kw: Any) -> ListResult:
        result = listed(res, **kw)
        return ListResult(result.items, result.resource_version, [bad] if res is CLAIMS else [])

    api.list = with_bad  # type: ignore[method-assign]
    got = b.Bundle()
    b.collect_cluster(got, api, DRIVER, Engine(), [])
    assert got.problems == ["resourceclaims: ns/bad (uid u2) cannot be decoded and is left out: "
                            "str is not valid UTF-8: surrogates not allowed"]
    assert [c["metadata"]["name"] for c in json.loads(got.files["cluster/resourceclaims.json"])] == ["c1"]


# Seeded into every kind of object the bundle collects; none may be in the archive.
SEEDED = {
    "cmd": "S3cretCommandLine-7781", "arg": "--password=S3cretArg-4412", "probe": "S3cretProbe-0917",
    "note": "S3cretAnnotation-5531", "access": "S3cretAccessToken-2290", "pw": "S3cretPassword-8830",
    "api": "S3cretApiKey-6604", "key": "S3cretBareKey-1175", "client": "S3cretClientSecret-3346",
    "env": "S3cretEnvValue-9902", "class": "S3cretClassToken-4420", "event": "S3cretEventNote-1209",
}


def seeded_cluster() -> FakeKube:
    s = SEEDED
    api = FakeKube()
    api.add(SLICES, {"metadata": {"name": "s1", "annotations": {"team": s["note"]}}, "spec": {
        "driver": DRIVER, "nodeName": "n1", "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "gpu-0", "taints": [{"key": "example.com/maintenance", "effect": "NoSchedule"}]}]}})
    api.add(DEVICE_CLASSES, {"metadata": {"name": "gpu.gpu.dra-driver.io"}, "spec": {"config": [{"opaque": {
        "driver": DRIVER, "parameters": {"registry": {"Token": s["class"]}}}}]}})
    api.add(CLAIMS, {"metadata": {"name": "c1", "namespace": "ns", "annotations": {
        "gpu.dra-driver.io/explanation-summary": "no GPU left", "other.example.com/x": s["note"]}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu.dra-driver.io"}}],
                             "config": [{"opaque": {"driver": DRIVER, "parameters": {
                                 "accessToken": s["access"], "db": {"PASSWORD": s["pw"], "api-key": s["api"]},
                                 "key": s["key"], "oauth": {"client_secret": s["client"]}}}}]}}})
    api.add(PODS, {"metadata": {"name": "user", "namespace": "ns", "annotations": {"deploy-notes": s["note"]}},
                   "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}],
                            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                            "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", s["cmd"]],
                                            "args": [s["arg"]], "env": [{"name": "PLAIN", "value": s["env"]}],
                                            "livenessProbe": {"exec": {"command": ["check", s["probe"]]}}}]}})
    api.add(EVENTS, {"metadata": {"name": "e", "namespace": "ns", "annotations": {"x": s["event"]}},
                     "reason": "Unsatisfiable", "note": f"saw {s['env']} in the log",
                     "regarding": {"kind": "ResourceClaim", "name": "c1", "namespace": "ns"}})
    return api


def test_a_bundle_of_a_seeded_cluster_holds_none_of_the_secrets(tmp_path: Path) -> None:
    got = b.Bundle()
    b.collect_cluster(got, seeded_cluster(), DRIVER, Engine(), ["n1"])
    out = tmp_path / "bundle.tar.gz"
    b.write_bundle(got, "top", str(out))
    with tarfile.open(out) as tar:
        text = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()).decode()  # type: ignore[union-attr]
    for what, secret in SEEDED.items():
        assert secret.split("=")[-1] not in text, f"{what} ({secret}) is in the bundle"
    assert not got.problems
    files = {k: json.loads(v) for k, v in got.scrubbed().items()}
    # What debugging needs stays: the driver's own annotations, keys that only name a key, the shape.
    (claim,) = files["cluster/resourceclaims.json"]
    assert claim["metadata"]["annotations"] == {"gpu.dra-driver.io/explanation-summary": "no GPU left",
                                                "other.example.com/x": b.REDACTED}
    (pod_out,) = files["cluster/pods.json"]
    container = pod_out["spec"]["containers"][0]
    assert container["command"] == [b.REDACTED] * 3 and container["args"] == [b.REDACTED]
    assert container["image"] == "busybox" and container["env"] == [{"name": "PLAIN", "value": b.REDACTED}]
    assert pod_out["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    (slice_out,) = files["cluster/resourceslices.json"]
    assert slice_out["spec"]["devices"][0]["taints"][0]["key"] == "example.com/maintenance"


def test_credential_keys() -> None:
    for name in ("token", "accessToken", "ACCESS_TOKEN", "password", "PASSWORD", "clientSecret", "client_secret",
                 "apiKey", "api-key", "x-api-key", "key", "privateKey", "client-key-data", "bearerToken",
                 "Authorization", "sshPassphrase", "AWS_SECRET_ACCESS_KEY", "credentials"):
        assert b.credential_key(name), name
    for name in ("secretName", "secretKeyRef", "tokenFile", "name", "monkey", "keyring", "keys", "tokenExpiry"):
        assert not b.credential_key(name), name
    # Flags and counts under such a name stay: they are no credential.
    assert b.redact({"automountServiceAccountToken": False, "token": 3}) == {
        "automountServiceAccountToken": False, "token": 3}
