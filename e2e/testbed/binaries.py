"""Build and cache the real Kubernetes control-plane binaries from Go modules.

Nothing is downloaded except through the Go module proxy: a throwaway Go module requires
``k8s.io/kubernetes`` at the pinned release and pins every staging module to its published
``v0.x`` twin, because the release's own go.mod points them at ``./staging`` paths that do not
exist outside the monorepo.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
K8S_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet")
ALL_BINARIES = (*K8S_COMMANDS, "etcd")


def cache_root() -> Path:
    base = os.environ.get("DRA_TESTBED_CACHE") or os.environ.get("XDG_CACHE_HOME")
    root = Path(base) if base else Path.home() / ".cache"
    return root / "dra-driver" / "testbed"


def bin_dir(version: str = KUBERNETES_VERSION) -> Path:
    return cache_root() / f"k8s-{version}-etcd-{ETCD_VERSION}" / "bin"


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(
            f"testbed: command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}"
        )
    return proc.stdout


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CGO_ENABLED", "0")
    env["GOFLAGS"] = "-buildvcs=false -mod=mod"
    env.setdefault("GOTOOLCHAIN", "local")
    return env


def staging_modules(kubernetes_gomod: str) -> list[str]:
    """The module paths that k8s.io/kubernetes replaces with ./staging directories."""
    return sorted(set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", kubernetes_gomod, re.M)))


def _module_gomod(module: str, version: str, cwd: Path, env: dict[str, str]) -> str:
    info = json.loads(_run(["go", "mod", "download", "-json", f"{module}@{version}"], cwd, env))
    return Path(info["GoMod"]).read_text()


def _write_module(work: Path, require: str, version: str, replaces: dict[str, str]) -> None:
    lines = ["module dra-driver.local/testbed-build", "", "go 1.25", "", f"require {require} {version}", ""]
    if replaces:
        lines.append("replace (")
        lines += [f"\t{mod} => {mod} {ver}" for mod, ver in sorted(replaces.items())]
        lines.append(")")
    (work / "go.mod").write_text("\n".join(lines) + "\n")
    # A blank import keeps `go mod tidy` from dropping the requirement.
    (work / "tools.go").write_text(f'//go:build tools\n\npackage tools\n\nimport _ "{require}"\n')


def _version_ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return "-s -w " + " ".join(flags)


def build_kubernetes(out: Path, version: str, log: bool) -> None:
    work = out.parent / "build-k8s"
    work.mkdir(parents=True, exist_ok=True)
    env = _go_env()
    gomod = _module_gomod("k8s.io/kubernetes", version, work, env)
    staging_version = "v0." + version.lstrip("v").split(".", 1)[1]
    _write_module(work, "k8s.io/kubernetes", version, {m: staging_version for m in staging_modules(gomod)})
    _run(["go", "mod", "tidy", "-e"], work, env)
    targets = [f"k8s.io/kubernetes/cmd/{name}" for name in K8S_COMMANDS]
    if log:
        print(f"testbed: building {', '.join(K8S_COMMANDS)} {version} (a cold build takes several minutes)", flush=True)
    _run(["go", "build", "-trimpath", "-ldflags", _version_ldflags(version), "-o", str(out) + "/", *targets], work, env)


def build_etcd(out: Path, log: bool) -> None:
    work = out.parent / "build-etcd"
    work.mkdir(parents=True, exist_ok=True)
    env = _go_env()
    _write_module(work, "go.etcd.io/etcd/server/v3", ETCD_VERSION, {})
    _run(["go", "mod", "tidy", "-e"], work, env)
    if log:
        print(f"testbed: building etcd {ETCD_VERSION}", flush=True)
    _run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "etcd"), "go.etcd.io/etcd/server/v3"], work, env)


def ensure(version: str = KUBERNETES_VERSION, log: bool = True) -> Path:
    """Return the directory holding every binary, building what is missing."""
    out = bin_dir(version)
    stamp = out / ".complete"
    if stamp.exists() and all((out / b).exists() for b in ALL_BINARIES):
        return out
    if shutil.which("go") is None:
        raise SystemExit("testbed: the Go toolchain is required to build the Kubernetes binaries (install Go >= 1.25)")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if not all((out / b).exists() for b in K8S_COMMANDS):
        build_kubernetes(out, version, log)
    if not (out / "etcd").exists():
        build_etcd(out, log)
    seconds = round(time.monotonic() - started, 1)
    stamp.write_text(json.dumps({"kubernetes": version, "etcd": ETCD_VERSION, "build_seconds": seconds}))
    if log:
        print(f"testbed: binaries ready in {out} after {time.monotonic() - started:.0f}s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build or locate the cached Kubernetes test-bed binaries.")
    parser.add_argument("--version", default=KUBERNETES_VERSION)
    parser.add_argument("--print-dir", action="store_true", help="print the binary directory and exit")
    args = parser.parse_args(argv)
    out = ensure(args.version, log=not args.print_dir)
    if args.print_dir:
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
