"""The fleet commands' errors (one line, exit status 1) and that they cannot write."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleetfix import fleet, one_line, run, template
from kubefake import FakeKube

from dra_driver import cli
from dra_driver.k8s.client import CLAIM_TEMPLATES, DEVICE_CLASSES, ApiError
from dra_driver.tools.fleet import command
from dra_driver.tools.fleet.reads import ReadOnly


@pytest.mark.parametrize(("argv", "message"), [
    (("fit", "--template", "nope"), "kubectl dra fit: ResourceClaimTemplate default/nope not found"),
    (("fit", "pod/nope"), "kubectl dra fit: Pod default/nope not found"),
    (("fit", "--template", "other"),
     "kubectl dra fit: ResourceClaimTemplate default/other is a claim of other.example.com, not of gpu.dra-driver.io"),
    (("fit",), "kubectl dra fit: name one thing to fit: -f FILE, --template [NAMESPACE/]NAME or pod/NAME"),
    (("fit", "deploy/x"), "kubectl dra fit: fit takes a pod as pod/NAME (or -f FILE, --template NAME); got 'deploy/x'"),
    (("fit", "--template", "t", "--count", "0"), "kubectl dra fit: --count must be between 1 and 100000, got 0"),
    (("fit", "-f", "/nonexistent/claim.yaml"), "kubectl dra fit: cannot read /nonexistent/claim.yaml: No such file or directory"),
    (("get", "gpus", "-n", "Bad_NS"), "kubectl dra get: invalid namespace 'Bad_NS' (must be a DNS label)"),
    (("get", "gpus", "-A", "-n", "x"), "kubectl dra get: -A reads every namespace; leave out -n"),
])
def test_bad_input_is_one_line(argv: tuple[str, ...], message: str) -> None:
    kube = fleet()
    kube.add(DEVICE_CLASSES, {"metadata": {"name": "other"},
                              "spec": {"selectors": [{"cel": {"expression": 'device.driver == "other.example.com"'}}]}})
    kube.add(CLAIM_TEMPLATES, template("other", cls="other"))
    assert one_line(run(kube, *argv)) == message


def test_a_file_of_another_kind_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text("kind: Pod\nmetadata: {name: x}\n")
    assert one_line(run(fleet(), "fit", "-f", str(path))) == (
        f"kubectl dra fit: {path}: expected a ResourceClaim or ResourceClaimTemplate, got kind 'Pod'")


@pytest.mark.parametrize("argv", [("get", "gpus"), ("get", "nodes"), ("top",), ("fit", "--template", "t")])
def test_an_unreachable_cluster_is_one_line(argv: tuple[str, ...]) -> None:
    kube = fleet()
    kube.unreachable = True
    assert one_line(run(kube, *argv)) == f"kubectl dra {argv[0]}: cannot reach the cluster: connection refused"


def test_a_forbidden_namespace_is_one_line() -> None:
    kube = fleet()
    kube.fail["get:resourceclaimtemplates"] = ApiError(403, "Forbidden", 'resourceclaimtemplates "t" is forbidden')
    assert one_line(run(kube, "fit", "--template", "t", "-n", "secret")).startswith("kubectl dra fit: not allowed: ")
    kube.fail["list:resourceslices"] = ApiError(403, "Forbidden", "resourceslices is forbidden")
    assert one_line(run(kube, "top")).startswith("kubectl dra top: not allowed: ")


def test_a_bug_is_not_the_users_mistake(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object, **__: object) -> None:
        raise TypeError("boom")

    monkeypatch.setattr(command, "device_rows", broken)
    assert one_line(run(fleet(), "top")) == "kubectl dra top: unexpected error: TypeError: boom"


# --- nothing is written --------------------------------------------------------------------------


def test_the_commands_get_a_client_that_cannot_write() -> None:
    reader = ReadOnly(FakeKube())
    for verb in ("create", "replace", "replace_status", "merge_patch", "apply_status", "delete", "watch"):
        assert not hasattr(reader, verb), verb
    with pytest.raises(AttributeError):
        reader.extra = 1  # type: ignore[attr-defined]


def test_kubectl_finds_the_commands(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    for argv in (["get", "gpus"], ["top"], ["fit", "--template", "t"], ["fit", "pod", "-n", "ml", "trainer"]):
        rc = cli.kubectl_main([*argv, "--kubeconfig", str(missing)])
        err = capsys.readouterr().err
        assert rc == 1 and err == f"kubectl dra {argv[0]}: kubeconfig {missing} does not exist\n"
