"""The Go tools' pins: committed, complete, readonly, and the only input of their cache key."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from e2e.tooling import gotools, prereqs

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture()
def pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the committed pins, so a test can bump or break one."""
    copy = tmp_path / "gotools"
    shutil.copytree(gotools.PINS, copy)
    monkeypatch.setattr(gotools, "PINS", copy)
    monkeypatch.setenv("DRA_TESTBED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gotools, "_go_version", lambda: "go1.26.8")
    monkeypatch.setattr(gotools, "_libseccomp_version", lambda: "libseccomp-2.5.4")
    return copy


def test_every_tool_is_pinned_with_go_mod_and_go_sum() -> None:
    for tool in gotools.TOOLS.values():
        gomod = (tool.folder / "go.mod").read_text()
        assert (tool.folder / "go.sum").stat().st_size > 0, tool.name
        assert tool.version().startswith("v"), tool.name
        # A library's or our own command's main package is its own folder, not an upstream command.
        expected = set() if tool.ours else set(tool.commands)
        assert set(gotools.directive(gomod, "tool")) == expected, f"{tool.name}: tool lines"
        # Local replaces cannot resolve outside upstream's repository.
        assert not any(right.startswith(".") for _, right in gotools._replaces(gomod)), tool.name


def test_kubernetes_staging_modules_are_pinned_to_their_published_twins() -> None:
    gomod = (gotools.TOOLS["kubernetes"].folder / "go.mod").read_text()
    version = gotools.TOOLS["kubernetes"].version()
    twin = "v0." + version.split(".", 1)[1]
    replaces = dict(gotools._replaces(gomod))
    assert replaces["k8s.io/api"] == f"k8s.io/api {twin}"
    assert replaces["k8s.io/kubectl"] == f"k8s.io/kubectl {twin}"


def test_directive_reads_single_line_and_block_forms() -> None:
    gomod = ("module m\nrequire a.io/x v1.0.0 // indirect\nrequire (\n\tb.io/y v2.0.0\n\n)\n"
             "tool c.io/z/cmd\nreplace (\n\td.io/w => e.io/w v1.1.0\n)\n")
    assert gotools.requirements(gomod) == {"a.io/x": "v1.0.0", "b.io/y": "v2.0.0"}
    assert gotools.directive(gomod, "tool") == ["c.io/z/cmd"]
    assert gotools._replaces(gomod) == [("d.io/w", "e.io/w v1.1.0")]


def test_upstream_replaces_keep_remote_ones_and_map_staging() -> None:
    upstream = ("module k8s.io/kubernetes\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n"
                "\tgithub.com/a/b v1.0.0 => github.com/c/b v1.0.1 // fork\n)\nreplace foo => ../foo\n")
    assert gotools.upstream_replaces(upstream, "v1.36.4") == [
        "k8s.io/api => k8s.io/api v0.36.4", "github.com/a/b v1.0.0 => github.com/c/b v1.0.1"]


def test_cache_key_follows_the_pins_and_nothing_else(pins: Path) -> None:
    key = gotools.cache_key(["cni-plugins"])
    assert gotools.cache_key(["cni-plugins"]) == key
    assert gotools.cache_key(["etcd"]) != key
    gosum = pins / "cni-plugins" / "go.sum"
    gosum.write_text(gosum.read_text() + "example.com/x v1.0.0 h1:AAAA=\n")
    assert gotools.cache_key(["cni-plugins"]) != key, "a changed go.sum must rebuild"
    gomod = pins / "cni-plugins" / "go.mod"
    gomod.write_text(gomod.read_text().replace("containernetworking/plugins v1.9.1", "containernetworking/plugins v1.9.2"))
    assert "v1.9.2" in gotools.bin_dir(["cni-plugins"]).name


def test_runc_build_features_are_part_of_its_key(pins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = gotools.cache_key(["runc"])
    monkeypatch.setattr(gotools, "_libseccomp_version", lambda: "libseccomp-2.6.0")
    assert gotools.cache_key(["runc"]) != key


def test_runc_without_libseccomp_refuses_at_once_naming_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = shutil.which
    monkeypatch.setattr(gotools.shutil, "which", lambda cmd: None if cmd == "pkg-config" else real_which(cmd))
    with pytest.raises(gotools.ToolError, match=r"libseccomp-dev.*apt-get install .*pkg-config"):
        gotools.ensure(["runc"], log=False)


def test_a_partial_build_is_never_cached(pins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gotools, "_have", lambda cmd: True)

    def half_build(tool: gotools.Tool, commands: dict[str, str], out: Path, log: bool) -> None:
        (out / "loopback").write_text("built")
        raise gotools.ToolError("gotools: building cni-plugins failed")

    monkeypatch.setattr(gotools, "_build_one", half_build)
    with pytest.raises(gotools.ToolError):
        gotools.ensure(["cni-plugins"], log=False)
    out = gotools.bin_dir(["cni-plugins"])
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if not p.name.endswith(".lock")]


CONTROL_PLANE = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"]
BED = ["kubernetes", "etcd"]


@dataclasses.dataclass
class FakeGo:
    built: list[str] = dataclasses.field(default_factory=list)
    """The binary each ``go build`` wrote, in order."""
    fail: set[str] = dataclasses.field(default_factory=set)
    """Binaries whose ``go build`` fails."""


@pytest.fixture()
def go(pins: Path, monkeypatch: pytest.MonkeyPatch) -> FakeGo:
    """A go that writes a file where ``-o`` says (nothing is compiled)."""
    fake = FakeGo()
    monkeypatch.setattr(gotools, "_have", lambda cmd: True)

    def run(cmd: list[str], cwd: Path, env: dict[str, str], what: str) -> str:
        assert cmd[:2] == ["go", "build"], cmd
        out = cmd[cmd.index("-o") + 1]
        if out.endswith("/"):  # every command in one build, each named after its package
            packages = cmd[cmd.index("-o") + 2:]
            targets = [(Path(out) / p.rsplit("/", 1)[-1], p) for p in packages]
        else:
            targets = [(Path(out), cmd[-1])]
        if any(target.name in fake.fail for target, _ in targets):
            raise gotools.ToolError(f"gotools: {what} failed (2): {' '.join(cmd)}")
        for target, package in targets:
            target.write_text(f"built from {package}")
            fake.built.append(target.name)
        return ""

    monkeypatch.setattr(gotools, "_run", run)
    return fake


def _stamp(out: Path) -> dict[str, Any]:
    stamp: dict[str, Any] = json.loads((out / gotools.STAMP).read_text())
    return stamp


def test_a_subset_then_the_whole_set_builds_only_what_is_missing_into_one_folder(go: FakeGo) -> None:
    out = gotools.ensure(BED, log=False, only=CONTROL_PLANE)
    assert sorted(go.built) == sorted(CONTROL_PLANE)
    assert out == gotools.bin_dir(BED), "the folder and its key do not depend on the subset"
    assert not (out / "kubelet").exists()
    assert sorted(_stamp(out)["binaries"]) == sorted(CONTROL_PLANE)
    go.built.clear()
    assert gotools.ensure(BED, log=False, only=["kubectl"]) == out
    assert go.built == [], "a subset already there builds nothing"
    assert gotools.ensure(BED, log=False) == out
    assert go.built == ["kubelet"]
    assert sorted(_stamp(out)["binaries"]) == sorted([*CONTROL_PLANE, "kubelet"])
    assert _stamp(out)["build_seconds"].keys() == {"kubernetes"}
    assert (out / "kube-apiserver").read_text() == "built from k8s.io/kubernetes/cmd/kube-apiserver"
    assert sorted(p.name for p in out.parent.iterdir() if not p.name.endswith(".lock")) == [out.name]


def test_a_failed_addition_keeps_the_subset_and_caches_nothing_of_itself(go: FakeGo) -> None:
    out = gotools.ensure(BED, log=False, only=CONTROL_PLANE)
    stamp = (out / gotools.STAMP).read_text()
    go.built.clear()
    go.fail.add("kubelet")
    with pytest.raises(gotools.ToolError, match="building kubernetes failed"):
        gotools.ensure(BED, log=False)
    assert not (out / "kubelet").exists()
    assert (out / gotools.STAMP).read_text() == stamp
    assert gotools._complete(out, gotools._wanted(BED, CONTROL_PLANE))
    assert not gotools._complete(out, gotools._wanted(BED))
    assert sorted(p.name for p in out.parent.iterdir() if not p.name.endswith(".lock")) == [out.name]


def test_a_crash_before_the_stamp_leaves_whole_binaries_that_the_next_build_keeps(
        go: FakeGo, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(tmp: Path, out: Path, stamp: dict[str, object]) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(gotools, "_write_stamp", crash)
        with pytest.raises(KeyboardInterrupt):
            gotools.ensure(["etcd"], log=False)
    out = gotools.bin_dir(["etcd"])
    assert (out / "etcd").exists() and not (out / gotools.STAMP).exists()
    assert not gotools._complete(out, gotools._wanted(["etcd"])), "binaries without a stamp do not look complete"
    go.built.clear()
    assert gotools.ensure(["etcd"], log=False) == out
    assert go.built == [], "each binary got there by a rename, whole: kept"
    assert _stamp(out)["binaries"] == ["etcd"]


def test_complete_needs_the_stamp_and_every_binary_asked_for(pins: Path, tmp_path: Path) -> None:
    out = tmp_path / "folder"
    out.mkdir()
    (out / "etcd").write_text("")
    assert not gotools._complete(out, gotools._wanted(["etcd"]))
    (out / gotools.STAMP).write_text("{}")
    assert gotools._complete(out, gotools._wanted(["etcd"]))
    assert not gotools._complete(out, gotools._wanted(BED, ["etcd", "kubectl"]))
    assert gotools._complete(out, gotools._wanted(BED, ["etcd"]))


def test_asking_for_a_binary_the_tools_do_not_build_names_the_ones_they_do(pins: Path) -> None:
    with pytest.raises(gotools.ToolError, match=r"kubernetes, etcd build no kube-proxy; they build: etcd, kube-apiserver, "):
        gotools.ensure(BED, log=False, only=["kubectl", "kube-proxy"])


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go (a prerequisite of make test)")
def test_check_fails_when_go_sum_lacks_a_module(pins: Path) -> None:
    """What `make pins-check` relies on: a readonly listing refuses anything go.sum does not name."""
    assert gotools.check(["cni-plugins"]) == []
    gosum = pins / "cni-plugins" / "go.sum"
    gosum.write_text("".join(line for line in gosum.read_text().splitlines(keepends=True)
                             if not line.startswith("github.com/vishvananda/netlink ")))
    problems = gotools.check(["cni-plugins"])
    assert problems and "vishvananda/netlink" in problems[0]


def test_no_build_step_tidies_or_resolves_latest() -> None:
    grep = subprocess.run(["git", "grep", "-n", "-E", r"mod tidy|@latest", "--", "e2e", "deploy", "scripts", "Makefile"],
                          cwd=ROOT, capture_output=True, text=True, check=False).stdout
    offenders = [line for line in grep.splitlines()
                 if not line.startswith(("e2e/tooling/gotools.py", "unit_tests/"))]
    assert offenders == []
    # gotools.py tidies only when a person re-pins, never on the build path.
    build_path = Path(gotools.__file__).read_text().split("# --- pinning")[0]
    assert "tidy" not in build_path.split('"""', 2)[2]


def test_prereqs_name_the_missing_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prereqs, "_go_problem", lambda: None)
    monkeypatch.setattr(prereqs, "CHECKS", {"test": [("libseccomp-dev", lambda: False, "runc"),
                                                     ("gcc", lambda: True, "cgo")]})
    found = prereqs.problems("test")
    assert "install them with: apt-get install -y libseccomp-dev" in found
    assert prereqs.missing_packages("test") == [("libseccomp-dev", "runc")]
    assert not any(line.startswith("gcc") for line in found)


def test_a_library_key_follows_its_own_source(pins: Path) -> None:
    key = gotools.cache_key(["mock-nvml"])
    source = pins / "mock-nvml" / "machine.go"
    source.write_text(source.read_text() + "\n// changed\n")
    assert gotools.cache_key(["mock-nvml"]) != key, "a changed shim must rebuild"


def test_library_link_scripts_export_the_source_and_stub_the_rest(tmp_path: Path) -> None:
    (tmp_path / "a.go").write_text("package main\n//export nvmlInit_v2\nfunc nvmlInit_v2() {}\n// not an //export x\n")
    (tmp_path / "b.go").write_text("package main\n//export nvmlShutdown\nfunc nvmlShutdown() {}\n")
    exports = gotools.exported_functions(tmp_path)
    assert exports == ["nvmlInit_v2", "nvmlShutdown"]
    header = ("nvmlReturn_t DECLDIR nvmlInit_v2(void);\nconst DECLDIR char* nvmlErrorString(nvmlReturn_t r);\n"
              "DEPRECATED(13.0) nvmlReturn_t DECLDIR nvmlOld(unsigned int *x);\nnvmlReturn_t DECLDIR nvmlShutdown(void);\n")
    assert gotools.declared_functions(header) == ["nvmlErrorString", "nvmlInit_v2", "nvmlOld", "nvmlShutdown"]
    assert gotools.version_script(exports) == "{\n  global:\n    nvmlInit_v2;\n    nvmlShutdown;\n  local: *;\n};\n"
    assert gotools.not_implemented_script(gotools.declared_functions(header), exports, "stub") == (
        "PROVIDE(nvmlErrorString = stub);\nPROVIDE(nvmlOld = stub);\n")


def test_our_own_command_key_follows_its_source(pins: Path) -> None:
    key = gotools.cache_key(["baseline-driver"])
    source = pins / "baseline-driver" / "main.go"
    source.write_text(source.read_text() + "\n// changed\n")
    assert gotools.cache_key(["baseline-driver"]) != key, "a changed baseline driver must rebuild"


# What `go mod tidy -e` printed on 2026-11-28 for kube-scheduler v1.38.0-beta.0 (the proxy refused k8s.io/ktesting).
KTESTING_REFUSED = """go: downloading k8s.io/api v0.38.0-beta.0
go: k8s.io/kubernetes/cmd/kube-scheduler imports
\tk8s.io/kubernetes/cmd/kube-scheduler/app imports
\tk8s.io/client-go/tools/cache tested by
\tk8s.io/client-go/tools/cache.test imports
\tk8s.io/ktesting: k8s.io/ktesting@v0.38.0-beta.0: {refused}
\tserver response: This module version is not available.
go: k8s.io/kubernetes/cmd/kube-scheduler imports
\tk8s.io/kubernetes/pkg/scheduler/framework tested by
\tk8s.io/kubernetes/pkg/scheduler/framework.test imports
\tk8s.io/ktesting/initoption: k8s.io/ktesting@v0.38.0-beta.0: {refused}
\tserver response: This module version is not available.
""".format(refused="reading https://proxy.golang.org/k8s.io/ktesting/@v/v0.38.0-beta.0.zip: 403 Forbidden")
BUILD_IMPORT_REFUSED = """go: k8s.io/kubernetes/cmd/kube-apiserver imports
\tk8s.io/apiextensions-apiserver/pkg/apiserver imports
\tk8s.io/apiextensions-api/v1: k8s.io/apiextensions-api@v0.38.0-beta.0: {refused}
""".format(refused="reading https://proxy.golang.org/k8s.io/apiextensions-api/@v/v0.38.0-beta.0.info: 403 Forbidden")


def test_tidy_tolerates_only_named_modules_imported_by_tests_of_dependencies() -> None:
    assert gotools.untolerated_tidy_errors(KTESTING_REFUSED, ["k8s.io/ktesting"]) == []
    assert len(gotools.untolerated_tidy_errors(KTESTING_REFUSED, ["k8s.io/apiextensions-api"])) == 2
    # A refused module that a command itself imports is never tolerated, even when named.
    both = KTESTING_REFUSED + BUILD_IMPORT_REFUSED
    errors = gotools.untolerated_tidy_errors(both, ["k8s.io/ktesting", "k8s.io/apiextensions-api"])
    assert len(errors) == 1 and "kube-apiserver imports" in errors[0]
    # A module whose name only starts like a tolerated one is another module.
    assert gotools.untolerated_tidy_errors(KTESTING_REFUSED, ["k8s.io/ktest"]) != []


def test_a_toolchain_is_set_for_its_tool_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOTOOLCHAIN", raising=False)
    assert gotools.tool_env(gotools.TOOLS["kubernetes-1.38"])["GOTOOLCHAIN"] == "go1.27.3"
    for name, tool in gotools.TOOLS.items():
        if name != "kubernetes-1.38":
            assert gotools.tool_env(tool)["GOTOOLCHAIN"] == "local", name
    # Its go line is newer than the machine's Go may be: make prereqs asks only for what the others need.
    assert prereqs._go_line(gotools.TOOLS["kubernetes-1.38"].folder / "go.mod") == "1.27.0"


def test_a_toolchain_is_part_of_its_tools_key(pins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = gotools.cache_key(["kubernetes-1.38"])
    bumped = dataclasses.replace(gotools.TOOLS["kubernetes-1.38"], toolchain="go1.27.4")
    monkeypatch.setitem(gotools.TOOLS, "kubernetes-1.38", bumped)
    assert gotools.cache_key(["kubernetes-1.38"]) != key


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go (a prerequisite of make test)")
def test_prereqs_ask_for_the_machines_go_only_for_tools_without_their_own_toolchain() -> None:
    have = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()
    if prereqs._version_tuple(have) >= (1, 27):
        pytest.skip(f"this machine's {have} satisfies the 1.38 pin's go line anyway")
    assert prereqs._go_problem() is None


def test_a_repin_keeps_our_own_replaces(pins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make pin TOOL=kubernetes-1.38@<next tag>` writes upstream's replaces, then ours, every time."""
    upstream = pins / "upstream.mod"
    upstream.write_text("module k8s.io/kubernetes\n\ngo 1.27.0\n\nreplace k8s.io/api => ./staging/src/k8s.io/api\n")
    monkeypatch.setattr(gotools, "_have", lambda cmd: True)
    monkeypatch.setattr(gotools, "_download", lambda spec, env: {"GoMod": str(upstream)})
    monkeypatch.setattr(gotools, "_tidy", lambda tool: None)
    gotools.pin("kubernetes-1.38", "v1.38.0-rc.0")
    gomod = (pins / "kubernetes-1.38" / "go.mod").read_text()
    assert gotools._replaces(gomod) == [
        ("k8s.io/api", "k8s.io/api v0.38.0-rc.0"),
        ("sigs.k8s.io/structured-merge-diff/v7", "sigs.k8s.io/structured-merge-diff/v7 v7.0.0")]
    assert gotools.directive(gomod, "tool") == ["k8s.io/kubernetes/cmd/kube-scheduler"]
    assert gotools.requirements(gomod) == {"k8s.io/kubernetes": "v1.38.0-rc.0"}
    assert "\ngo 1.27.0\n" in gomod


def test_a_tag_the_proxy_does_not_serve_is_named_with_the_proxys_reason() -> None:
    stdout = json.dumps({"Path": "k8s.io/kubernetes", "Version": "v1.38.0-rc.0",
                         "Error": "k8s.io/kubernetes@v1.38.0-rc.0: invalid version: unknown revision v1.38.0-rc.0"})
    assert gotools.download_error(stdout, "") == "k8s.io/kubernetes@v1.38.0-rc.0: invalid version: unknown revision v1.38.0-rc.0"
    assert gotools.download_error("", "go: network unreachable\n") == "go: network unreachable"
