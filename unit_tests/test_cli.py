"""The command line's error paths: each is one line on stderr naming what is wrong, exit status 1
(2 for what argparse refuses), and never a traceback. The in-process tests run ``main()`` with
stderr captured; the ones that run a program (the plugin, ``--version``) run the real entry point."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ctrlfix import add_claim, add_pod, claim, cluster, pod

from dra_driver import __version__, cli
from dra_driver.allocator.rules import RULE_CHOICES
from dra_driver.tools.explain import command as explain
from dra_driver.tools.explain.targets import TYPES

REPO = Path(__file__).resolve().parents[1]
VARIABLES = ("KUBECONFIG", "NODE_NAME", "HEALTH_PORT", "SCHEDULER_RULES", "HEALTH_MONITORING", "METRICS_PORT",
             "DRIVER_NAME", "API_PROFILE", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "ROLLING_UPDATE", "POD_UID")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)


def failed(capsys: pytest.CaptureFixture[str], rc: int, status: int = 1) -> str:
    """stderr, checked to be one line without a traceback after exit status ``status``."""
    err = capsys.readouterr().err
    assert rc == status, err
    assert "Traceback" not in err and err.endswith("\n") and err.count("\n") == 1, err
    return err.rstrip("\n")


def usage_error(capsys: pytest.CaptureFixture[str], argv: list[str], plugin: bool = False) -> str:
    """argparse's refusal: exit status 2, the usage, then one line of error, which is returned."""
    with pytest.raises(SystemExit) as exit_:
        (cli.kubectl_main if plugin else cli.main)(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("usage: ") and "Traceback" not in err, err
    return err.rstrip("\n").splitlines()[-1]


def program(*argv: str, **environ: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": environ.pop("HOME", "/nonexistent"), **environ}
    return subprocess.run([sys.executable, "-m", "dra_driver", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


# --- the programs: the repository's before-stop checks ----------------------------------------------


def test_a_malformed_variable_leaves_version_alone() -> None:
    proc = program("--version", HEALTH_PORT="x")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"dra-driver {__version__}\n", "")


def test_the_plugin_without_its_kubeconfig(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    proc = program("kubelet-plugin", "--node-name", "n1", "--kubeconfig", str(missing), "--gpu-backend", "simulated",
                   "--state-dir", str(tmp_path / "state"), "--kubelet-plugins-dir", str(tmp_path / "plugins"),
                   "--kubelet-registry-dir", str(tmp_path / "registry"), "--cdi-root", str(tmp_path / "cdi"),
                   "--log-format", "console")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines()[-1] == f"dra-driver kubelet-plugin: kubeconfig {missing} does not exist"
    assert "Traceback" not in proc.stderr + proc.stdout


def test_explain_without_its_kubeconfig(tmp_path: Path) -> None:
    proc = program("explain", "pod/x", "--kubeconfig", str(tmp_path / "missing"))
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == f"dra-driver explain: kubeconfig {tmp_path / 'missing'} does not exist\n"


# --- environment variables: read by the command that uses them, as strictly as the flag --------------


def test_a_malformed_port_variable(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEALTH_PORT", "8081x")
    err = failed(capsys, cli.main(["kubelet-plugin", "--node-name", "n1"]))
    assert err == ("dra-driver kubelet-plugin: $HEALTH_PORT (for --health-port): must be a port number "
                   "(0-65535, 0: off), got '8081x'")
    # The flag says the same of the same value, as argparse says it.
    assert usage_error(capsys, ["kubelet-plugin", "--health-port", "8081x"]) == (
        "dra-driver kubelet-plugin: error: argument --health-port: must be a port number (0-65535, 0: off), "
        "got '8081x'")


def test_a_variable_outside_its_choices(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    choices = ", ".join(RULE_CHOICES)
    monkeypatch.setenv("SCHEDULER_RULES", "1.35")
    err = failed(capsys, cli.main(["explain"]))
    assert err == f"dra-driver explain: $SCHEDULER_RULES (for --scheduler-rules): must be one of {choices}, got '1.35'"
    assert usage_error(capsys, ["explain", "--scheduler-rules", "1.35"]) == (
        f"dra-driver explain: error: argument --scheduler-rules: must be one of {choices}, got '1.35'")


def test_a_malformed_boolean_variable(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEALTH_MONITORING", "ture")
    err = failed(capsys, cli.main(["kubelet-plugin", "--node-name", "n1"]))
    assert err == "dra-driver kubelet-plugin: $HEALTH_MONITORING (for --health-monitoring): must be true or false, got 'ture'"


def test_a_controller_variable(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METRICS_PORT", "http")
    err = failed(capsys, cli.main(["controller"]))
    assert err == "dra-driver controller: $METRICS_PORT (for --metrics-port): must be a port number (0-65535, 0: off), got 'http'"


def test_the_probes_variable(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLING_UPDATE", "maybe")
    err = failed(capsys, cli.main(["probe"]))
    assert err == "dra-driver probe: $ROLLING_UPDATE (for --rolling-update): must be true or false, got 'maybe'"


def test_a_required_setting(capsys: pytest.CaptureFixture[str]) -> None:
    err = failed(capsys, cli.main(["kubelet-plugin"]))
    assert err == "dra-driver kubelet-plugin: --node-name (or $NODE_NAME) is required"


def test_the_variable_is_the_default_and_the_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from dra_driver.node.settings import plugin_settings

    def port(*argv: str) -> int:
        return plugin_settings(cli.build_parser().parse_args(["kubelet-plugin", "--node-name=n", *argv])).health_port

    assert port() == 0
    monkeypatch.setenv("HEALTH_PORT", "8081")
    assert port() == 8081 and port("--health-port=9000") == 9000


def test_the_api_profile_chooses_the_driver_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from dra_driver.node.settings import plugin_settings

    def settings(*argv: str) -> Any:
        return plugin_settings(cli.build_parser().parse_args(["kubelet-plugin", "--node-name=n",
                                                              f"--kubelet-plugins-dir={tmp_path}", *argv]))

    own = settings()
    assert (own.driver_name, own.api_profile.name, own.state_dir) == ("gpu.dra-driver.io", "dra-driver",
                                                                      tmp_path / "gpu.dra-driver.io")
    nvidia = settings("--api-profile=nvidia")
    # NVIDIA's plugin keeps its checkpoint.json in <plugins-dir>/gpu.nvidia.com: ours is never read for it.
    assert (nvidia.driver_name, nvidia.api_profile.name, nvidia.state_dir) == (
        "gpu.nvidia.com", "nvidia", tmp_path / "gpu.nvidia.com" / "dra-driver")
    monkeypatch.setenv("API_PROFILE", "nvidia")
    assert settings().driver_name == "gpu.nvidia.com" and settings("--api-profile=dra-driver").driver_name == (
        "gpu.dra-driver.io")
    from dra_driver.controller.settings import controller_settings

    # The controller resolves claims of the profile's driver.
    assert controller_settings(cli.build_parser().parse_args(["controller"])).driver_name == "gpu.nvidia.com"
    monkeypatch.delenv("API_PROFILE")
    assert settings("--driver-name=gpu.nvidia.com").api_profile.name == "nvidia"


def test_the_nvidia_profile_refuses_another_driver_name(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRIVER_NAME", "gpu.example.org")
    err = failed(capsys, cli.main(["kubelet-plugin", "--node-name", "n1", "--api-profile", "nvidia"]))
    assert err == ("dra-driver kubelet-plugin: --api-profile nvidia publishes as gpu.nvidia.com (the name its classes "
                   "and selectors read), not --driver-name gpu.example.org")
    monkeypatch.setenv("API_PROFILE", "nvdia")
    err = failed(capsys, cli.main(["controller"]))
    assert err == ("dra-driver controller: $API_PROFILE (for --api-profile): must be one of dra-driver, nvidia, "
                   "got 'nvdia'")


# --- running: a failure is the command's one line, not a usage error --------------------------------


def test_a_value_error_while_running_is_no_usage_error(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> int:
        raise ValueError("boom")

    monkeypatch.setattr(explain, "main", broken)
    assert failed(capsys, cli.main(["explain"])) == "dra-driver explain: unexpected error: ValueError: boom"


def test_a_value_error_reading_settings_is_a_bug_not_a_setting(capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Only SettingsError is the user's setting: a ValueError from the code that reads them is a bug,
    said as one (one line, exit status 1, no traceback), never as if the flags were wrong."""
    from dra_driver.node import settings

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise ValueError("boom")

    monkeypatch.setattr(settings, "plugin_settings", broken)
    err = failed(capsys, cli.main(["kubelet-plugin", "--node-name", "n1"]))
    assert err == "dra-driver kubelet-plugin: unexpected error: ValueError: boom"


@pytest.mark.parametrize("command", [["kubelet-plugin", "--node-name", "n1"], ["probe"]])
def test_a_settings_error_is_the_commands_own_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                                   command: list[str]) -> None:
    monkeypatch.setenv("ROLLING_UPDATE", "true")
    monkeypatch.setenv("POD_UID", "my-pod")
    err = failed(capsys, cli.main(command))
    assert err == f"dra-driver {command[0]}: --pod-uid 'my-pod' is not a pod UID (lower-case UUID)"


def test_an_unknown_flag_is_argparses(capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_error(capsys, ["explain", "--colour"]) == "dra-driver: error: unrecognized arguments: --colour"


# --- explain's arguments, as kubectl reads them --------------------------------------------------------


def test_an_unknown_type_lists_the_types(capsys: pytest.CaptureFixture[str]) -> None:
    err = failed(capsys, cli.main(["explain", "deploy/x"]))
    assert err == (f"dra-driver explain: unknown resource type 'deploy' in 'deploy/x'; explain takes {TYPES} "
                   "(claim x in namespace deploy: claim/x -n deploy)")
    err = failed(capsys, cli.main(["explain", "deployments.apps/x"]))
    assert err == f"dra-driver explain: unknown resource type 'deployments.apps' in 'deployments.apps/x'; explain takes {TYPES}"
    err = failed(capsys, cli.main(["explain", "deploy", "x"]))
    assert err == f"dra-driver explain: unknown resource type 'deploy' in 'deploy x'; explain takes {TYPES}"


def test_the_plugin_names_itself_as_kubectl_does(capsys: pytest.CaptureFixture[str]) -> None:
    err = failed(capsys, cli.kubectl_main(["explain", "pods.metrics.k8s.io/x"]))
    assert err == (f"kubectl dra explain: unknown resource type 'pods.metrics.k8s.io' in 'pods.metrics.k8s.io/x'; "
                   f"explain takes {TYPES}")
    assert usage_error(capsys, ["explain", "-o", "table"], plugin=True).startswith(
        "kubectl dra explain: error: argument --output/-o: invalid choice: 'table'")


def test_type_name_and_kubectls_booleans(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, bool, str]] = []

    def record(target: Any, **kwargs: Any) -> int:
        seen.append((target, kwargs["all_namespaces"], kwargs["output"]))
        return 0

    monkeypatch.setattr(explain, "main", record)
    for argv in (["pod", "-n", "team", "x"], ["--all-namespaces=true"], ["-A=false"], ["-A", "--all-namespaces=false"],
                 ["-A", "-o", "name"]):
        assert cli.kubectl_main(["explain", *argv]) == 0
    assert seen == [(["pod", "x"], False, "text"), ([], True, "text"), ([], False, "text"), ([], False, "text"),
                    ([], True, "name")]


def test_a_boolean_kubectl_would_refuse(capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_error(capsys, ["explain", "--all-namespaces=maybe"], plugin=True) == (
        "kubectl dra: error: argument --all-namespaces/-A: must be true or false, got 'maybe'")


def test_type_name_reaches_the_pod() -> None:
    kube = cluster(gpus=1)
    add_claim(kube, claim())
    add_pod(kube, pod("x", "c1"))
    out, err = io.StringIO(), io.StringIO()
    assert explain.main(["pod", "x"], api=kube, out=out, err=err) == 0
    assert out.getvalue().startswith("Pod default/x (Pending): 1 claim(s)") and err.getvalue() == ""
    assert explain.main(["pod", "missing"], api=kube, out=out, err=err) == 1
    assert err.getvalue() == "dra-driver explain: pod default/missing not found\n"


def test_output_name() -> None:
    kube = cluster(gpus=1)
    add_claim(kube, claim())
    add_pod(kube, pod("x", "c1"))
    for target in (["claim", "c1"], "pod/x", None):
        out, err = io.StringIO(), io.StringIO()
        assert explain.main(target, api=kube, output="name", out=out, err=err) == 0
        assert (out.getvalue(), err.getvalue()) == ("resourceclaim.resource.k8s.io/c1\n", ""), target


# --- help ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "plugin", "shows"), [
    (["kubelet-plugin", "--help"], False, ["[$HEALTH_PORT; default 0]", "Examples:\n  dra-driver kubelet-plugin"]),
    (["controller", "--help"], False, ["[$MAX_WRITES_PER_SECOND; default 250]", "Examples:"]),
    (["explain", "--help"], True, ["(default: text)", "Examples:", "kubectl dra explain pod trainer-0 -n ml"]),
    (["debug-bundle", "--help"], True, ["--context", "kubectl dra debug-bundle --context prod"]),
])
def test_help_shows_defaults_and_examples(capsys: pytest.CaptureFixture[str], argv: list[str], plugin: bool,
                                          shows: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        (cli.kubectl_main if plugin else cli.main)(argv)
    out = " ".join(capsys.readouterr().out.split(" "))
    assert exit_.value.code == 0
    for text in shows:
        assert text in out, (text, out)


# --- debug-bundle --------------------------------------------------------------------------------------


def test_a_bundle_of_nothing_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    err = failed(capsys, cli.kubectl_main(["debug-bundle", "--kubeconfig", str(missing), "-o", "b.tar.gz"]))
    assert err == f"kubectl dra debug-bundle: collected nothing, so wrote no bundle: cluster: kubeconfig {missing} does not exist"
    assert not (tmp_path / "b.tar.gz").exists()


def test_a_bundle_from_another_context(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("apiVersion: v1\nkind: Config\ncurrent-context: main\ncontexts:\n"
                      "- name: main\n  context: {cluster: c, user: u}\nclusters: []\nusers: []\n")
    err = failed(capsys, cli.main(["debug-bundle", "--kubeconfig", str(config), "--context", "prod"]))
    assert err == (f"dra-driver debug-bundle: collected nothing, so wrote no bundle: cluster: context 'prod' not "
                   f"found in kubeconfig {config}")


# --- migrate -------------------------------------------------------------------------------------------


def test_migrate_reads_its_config_before_the_cluster(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "dp.yaml").write_text("version: v2\n")
    err = failed(capsys, cli.kubectl_main(["migrate", "-f", "dp.yaml", "--kubeconfig", str(tmp_path / "missing")]))
    assert err == "kubectl dra migrate: dp.yaml: config (file): unknown version 'v2' (the device plugin's config is v1)"
    err = failed(capsys, cli.main(["migrate", "--configmap", "gpu-operator/dp", "--kubeconfig", str(tmp_path / "missing")]))
    assert err == f"dra-driver migrate: kubeconfig {tmp_path / 'missing'} does not exist"


def test_migrate_takes_one_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_error(capsys, ["migrate"], plugin=True) == (
        "kubectl dra migrate: error: one of the arguments --filename/-f --configmap is required")
    assert usage_error(capsys, ["migrate", "-f", "a", "--configmap", "b/c"]) == (
        "dra-driver migrate: error: argument --configmap: not allowed with argument --filename/-f")
