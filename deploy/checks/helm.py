"""Build a pinned ``helm`` from its Go module, then lint and render the chart.

Same approach as ``e2e/testbed/binaries.py``: nothing is downloaded except through the Go module
proxy. A throwaway module requires ``helm.sh/helm/v3`` at the pinned version (copying any
``replace`` directives of Helm's own go.mod, which do not apply to dependents) and builds
``helm.sh/helm/v3/cmd/helm``. The binary is cached under
``${XDG_CACHE_HOME:-~/.cache}/dra-driver/tools/helm-<version>/helm``.

Usage::

    python deploy/checks/helm.py --print-path     # build if needed, print the binary path
    python deploy/checks/helm.py                  # build if needed, then run every chart check
    python deploy/checks/helm.py --skip-if-no-go  # exit 0 with a message when Go is missing

The checks: ``helm lint --strict`` and ``helm template`` for several value combinations, every
rendered document parsed as YAML and checked for apiVersion/kind/metadata.name; values that the
schema or the templates must reject are rejected; a Kubernetes version below 1.34 is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

HELM_VERSION = "v3.19.5"
REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "deploy" / "helm" / "dra-driver"
# The Kubernetes version handed to `helm template`/`lint` (the chart refuses anything below 1.34).
KUBE_VERSION = "1.36.3"

# name -> extra `helm template` arguments; each must render and pass the document checks.
GOOD_COMBOS: dict[str, list[str]] = {
    "defaults": [],
    "simulated": ["--set", "gpuBackend=simulated", "--set", "simulatedProfile=a100-mig"],
    "nvml": ["--set", "gpuBackend=nvml", "--set", "nvml.driverRoot=/run/nvidia/driver", "--set", "nvml.runtimeClassName=nvidia"],
    "dynamic-mig": ["--set", "gpuBackend=nvml", "--set", "dynamicMig=true", "--set", "health.enabled=true"],
    "no-controller": ["--set", "controller.enabled=false", "--set", "deviceClasses.enabled=false"],
    "other-driver-name": ["--set", "driverName=gpu.example.org", "--set", "logFormat=console",
                          "--set", "admissionPolicy.enabled=false", "--set", "controller.replicas=2"],
}

# name -> (extra args, regex that the error output must match)
BAD_COMBOS: dict[str, tuple[list[str], str]] = {
    "bad-backend": (["--set", "gpuBackend=cuda"], r"gpuBackend"),
    "bad-log-format": (["--set", "logFormat=xml"], r"logFormat"),
    "bad-replicas": (["--set", "controller.replicas=-1"], r"replicas"),
    "bad-xid": (["--set-json", "ignoredXids=[\"thirteen\"]"], r"ignoredXids"),
    "unknown-key": (["--set", "gpuBakend=nvml"], r"gpuBakend|additional properties"),
    "old-kubernetes": (["--kube-version", "1.33.5"], r"1\.34"),
    "dynamic-mig-on-1.34": (["--set", "dynamicMig=true", "--kube-version", "1.34.2"], r"dynamicMig=true needs Kubernetes 1\.35"),
    "http-probe-without-port": (["--set", "kubeletPlugin.probes.mode=http", "--set", "kubeletPlugin.healthPort=0"],
                                r"healthPort"),
    "replicas-without-leader-election": (["--set", "controller.replicas=2", "--set", "controller.leaderElection.enabled=false"],
                                         r"leaderElection"),
}


def cache_dir(version: str = HELM_VERSION) -> Path:
    base = os.environ.get("XDG_CACHE_HOME")
    root = Path(base) if base else Path.home() / ".cache"
    return root / "dra-driver" / "tools" / f"helm-{version}"


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CGO_ENABLED", "0")
    env["GOFLAGS"] = "-buildvcs=false -mod=mod"
    env.setdefault("GOTOOLCHAIN", "local")
    return env


def _run(cmd: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), cwd=cwd, env=env, text=True, capture_output=True, check=False)


def _must(cmd: Sequence[str], cwd: Path, env: dict[str, str]) -> str:
    proc = _run(cmd, cwd, env)
    if proc.returncode != 0:
        raise SystemExit(f"helm-build: command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    return proc.stdout


def _replaces(gomod: str) -> list[str]:
    """The `replace` lines of a go.mod, single-line and block form, without the keyword."""
    out: list[str] = []
    block = False
    for raw in gomod.splitlines():
        line = raw.split("//", 1)[0].strip()
        if block:
            if line == ")":
                block = False
            elif line:
                out.append(line)
        elif line.startswith("replace ("):
            block = True
        elif line.startswith("replace "):
            out.append(line[len("replace "):].strip())
    # local-directory replacements cannot be used from outside the repository
    return [r for r in out if not re.search(r"=>\s*\.{1,2}/", r)]


def build(version: str = HELM_VERSION, log: bool = True) -> Path:
    out = cache_dir(version)
    binary = out / "helm"
    if binary.exists():
        return binary
    if shutil.which("go") is None:
        raise SystemExit("helm-build: the Go toolchain is required to build helm (install Go >= 1.24)")
    out.mkdir(parents=True, exist_ok=True)
    work = out / "build"
    work.mkdir(exist_ok=True)
    env = _go_env()
    module = "helm.sh/helm/v3"
    info = json.loads(_must(["go", "mod", "download", "-json", f"{module}@{version}"], work, env))
    replaces = _replaces(Path(info["GoMod"]).read_text())
    lines = ["module dra-driver.local/helm-build", "", "go 1.24", "", f"require {module} {version}", ""]
    if replaces:
        lines += ["replace (", *[f"\t{r}" for r in replaces], ")"]
    (work / "go.mod").write_text("\n".join(lines) + "\n")
    (work / "tools.go").write_text(f'//go:build tools\n\npackage tools\n\nimport _ "{module}/cmd/helm"\n')
    if log:
        print(f"helm-build: building helm {version} into {out} (a cold build takes a few minutes)", flush=True)
    _must(["go", "mod", "tidy", "-e"], work, env)
    pkg = "helm.sh/helm/v3/internal/version"
    ldflags = f"-s -w -X {pkg}.version={version} -X {pkg}.gitTreeState=clean"
    tmp = out / "helm.tmp"
    _must(["go", "build", "-trimpath", "-ldflags", ldflags, "-o", str(tmp), f"{module}/cmd/helm"], work, env)
    tmp.rename(binary)
    if log:
        print(f"helm-build: {_run([str(binary), 'version', '--short']).stdout.strip()} ready", flush=True)
    return binary


def _isolated_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(home / var.lower())
    return env


def template(helm: Path, args: Sequence[str] = (), env: dict[str, str] | None = None,
             kube_version: str = KUBE_VERSION, chart: Path = CHART_DIR) -> subprocess.CompletedProcess[str]:
    cmd = [str(helm), "template", "dra-driver", str(chart), "--namespace", "dra-driver"]
    if "--kube-version" not in args:
        cmd += ["--kube-version", kube_version]
    return _run([*cmd, *args], env=env)


def check_documents(text: str, label: str) -> list[str]:
    import yaml

    errors: list[str] = []
    kinds: list[str] = []
    for doc in yaml.safe_load_all(text):
        if doc is None:
            continue
        for key in ("apiVersion", "kind", "metadata"):
            if key not in doc:
                errors.append(f"{label}: document without {key}: {str(doc)[:200]}")
        if not doc.get("metadata", {}).get("name"):
            errors.append(f"{label}: {doc.get('kind')} without metadata.name")
        kinds.append(doc.get("kind", "?"))
    if "DaemonSet" not in kinds:
        errors.append(f"{label}: no DaemonSet rendered (kinds: {kinds})")
    return errors


def run_checks(helm: Path) -> int:
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="dra-helm-") as tmp:
        env = _isolated_env(Path(tmp))
        lint = _run([str(helm), "lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART_DIR)], env=env)
        print(f"$ helm lint --strict {CHART_DIR.relative_to(REPO_ROOT)} -> rc={lint.returncode}")
        if lint.returncode != 0:
            failures.append(f"helm lint failed:\n{lint.stdout}{lint.stderr}")
        for name, args in GOOD_COMBOS.items():
            proc = template(helm, args, env)
            if proc.returncode != 0:
                failures.append(f"template {name}: rc={proc.returncode}\n{proc.stderr}")
                print(f"template {name}: FAIL")
                continue
            errs = check_documents(proc.stdout, name)
            failures += errs
            print(f"template {name}: {'FAIL' if errs else 'ok'} ({proc.stdout.count(chr(10) + 'kind: ')} objects)")
            lint_args = [a for a in args if a != "--kube-version"]
            lproc = _run([str(helm), "lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART_DIR), *lint_args], env=env)
            if lproc.returncode != 0:
                failures.append(f"lint {name}: rc={lproc.returncode}\n{lproc.stdout}{lproc.stderr}")
        for name, (args, pattern) in BAD_COMBOS.items():
            proc = template(helm, args, env)
            output = proc.stdout + proc.stderr
            if proc.returncode == 0:
                failures.append(f"bad value {name} was accepted: {' '.join(args)}")
                print(f"reject {name}: FAIL (accepted)")
            elif not re.search(pattern, output):
                failures.append(f"bad value {name} rejected without naming /{pattern}/: {output.strip()[-500:]}")
                print(f"reject {name}: FAIL (unclear message)")
            else:
                first = next((ln for ln in output.splitlines() if re.search(pattern, ln)), "").strip()
                print(f"reject {name}: ok ({first[:160]})")
        # Chart.yaml's kubeVersion stops old clusters before any template runs; prove that the
        # template-level guard (for tools that ignore kubeVersion) fails too.
        loose = Path(tmp) / "chart-without-kubeversion"
        shutil.copytree(CHART_DIR, loose)
        chart_yaml = loose / "Chart.yaml"
        chart_yaml.write_text(re.sub(r"(?m)^kubeVersion:.*$\n?", "", chart_yaml.read_text()))
        proc = template(helm, ["--kube-version", "1.33.5"], env, chart=loose)
        if proc.returncode == 0 or "needs Kubernetes 1.34 or newer" not in proc.stderr:
            failures.append(f"template guard did not reject Kubernetes 1.33: rc={proc.returncode} {proc.stderr[-300:]}")
            print("reject template-guard-1.33: FAIL")
        else:
            print("reject template-guard-1.33: ok (template fail message)")
    if failures:
        print("\n".join(["", "FAILURES:", *failures]), file=sys.stderr)
        return 1
    print("helm checks: all passed")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default=HELM_VERSION)
    parser.add_argument("--print-path", action="store_true", help="build if needed, print the helm path, exit")
    parser.add_argument("--skip-if-no-go", action="store_true", help="exit 0 when Go is unavailable and helm is not cached")
    args = parser.parse_args(argv)
    if args.skip_if_no_go and shutil.which("go") is None and not (cache_dir(args.version) / "helm").exists():
        print("helm checks: skipped (no Go toolchain and no cached helm)")
        return 0
    helm = build(args.version, log=not args.print_path)
    if args.print_path:
        print(helm)
        return 0
    return run_checks(helm)


if __name__ == "__main__":
    sys.exit(main())
