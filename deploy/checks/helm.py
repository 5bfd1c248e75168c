"""Build the pinned ``helm`` from its committed Go module, then lint and render the chart.

helm is one of the project's Go tools (``e2e/tooling/gotools/helm``: go.mod + go.sum, built with
``-mod=readonly`` and cached by a hash of the pins; see ``e2e/tooling/gotools.py``).

Usage::

    python deploy/checks/helm.py --print-path     # build if needed, print the binary path
    python deploy/checks/helm.py                  # build if needed, then run every chart check
    python deploy/checks/helm.py --skip-if-no-go  # exit 0 with a message when Go is missing

The checks: ``helm lint --strict`` and ``helm template`` for several value combinations, every
rendered document parsed as YAML and checked for apiVersion/kind/metadata.name; values that the
schema or the templates must reject are rejected; a Kubernetes version below 1.36 is refused.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script: `python deploy/checks/helm.py`
    sys.path.insert(0, str(REPO_ROOT))

from e2e.tooling import gotools  # noqa: E402

CHART_DIR = REPO_ROOT / "deploy" / "helm" / "dra-driver"
# The Kubernetes version handed to `helm template`/`lint`: the bed's pinned release (the chart
# refuses anything below 1.36).
KUBE_VERSION = gotools.TOOLS["kubernetes"].version().lstrip("v")

# name -> extra `helm template` arguments; each must render and pass the document checks.
GOOD_COMBOS: dict[str, list[str]] = {
    "defaults": [],
    "simulated": ["--set", "gpuBackend=simulated", "--set", "simulatedProfile=a100-mig"],
    "nvml": ["--set", "gpuBackend=nvml", "--set", "nvml.driverRoot=/run/nvidia/driver", "--set", "nvml.runtimeClassName=nvidia"],
    "dynamic-mig": ["--set", "gpuBackend=nvml", "--set", "dynamicMig=true", "--set", "health.enabled=true"],
    "consumable-shares": ["--set", "consumableShares=4"],
    "consumable-shares-memory": ["--set", "consumableShares=memory", "--set", "dynamicMig=true"],
    "cdi-hook-from-host": ["--set", "nvml.cdiHook.source=host", "--set", "nvml.cdiHook.hostPath=/usr/local/bin/nvidia-cdi-hook"],
    "cdi-hook-install-dir": ["--set", "nvml.cdiHook.installDir=/home/kubernetes/bin/nvidia/"],
    "no-driver-edits": ["--set", "nvml.driverEdits=false"],
    "no-device-metadata": ["--set", "deviceMetadata.enabled=false"],
    "every-node": ["--set-json", "kubeletPlugin.gpuNodeLabels=[]", "--set", "kubeletPlugin.ignoreDevicePlugin=true"],
    "no-allocation-fence": ["--set", "allocationFence.enabled=false"],
    "monitoring": ["--set", "monitoring.enabled=true", "--set", "monitoring.labels.release=prometheus"],
    "no-controller": ["--set", "controller.enabled=false", "--set", "deviceClasses.enabled=false"],
    "controller-allocation": ["--set", "controller.allocation.enabled=true",
                              "--set", r"controller.allocation.namespaceSelector=team in (ml\,vision)"],
    "nvidia-api-profile": ["--set", "apiProfile=nvidia", "--set", "gpuBackend=simulated", "--set", "consumableShares=4",
                           "--set", "dynamicMig=true"],
    "other-driver-name": ["--set", "driverName=gpu.example.org", "--set", "logFormat=console",
                          "--set", "admissionPolicy.enabled=false", "--set", "controller.replicas=2"],
}

# name -> (extra args, regex that the error output must match)
BAD_COMBOS: dict[str, tuple[list[str], str]] = {
    "bad-backend": (["--set", "gpuBackend=cuda"], r"gpuBackend"),
    "bad-api-profile": (["--set", "apiProfile=nvdia"], r"apiProfile"),
    "nvidia-api-profile-other-name": (["--set", "apiProfile=nvidia", "--set", "driverName=gpu.example.org"],
                                      r"apiProfile nvidia publishes as gpu\.nvidia\.com"),
    "nvidias-name-own-profile": (["--set", "driverName=gpu.nvidia.com"], r"goes with apiProfile nvidia"),
    "bad-gpu-node-labels": (["--set-json", "kubeletPlugin.gpuNodeLabels=[true]"], r"gpuNodeLabels"),
    "bad-ignore-device-plugin": (["--set", "kubeletPlugin.ignoreDevicePlugin=maybe"], r"ignoreDevicePlugin"),
    "bad-log-format": (["--set", "logFormat=xml"], r"logFormat"),
    "bad-replicas": (["--set", "controller.replicas=-1"], r"replicas"),
    "zero-write-budget": (["--set", "controller.maxWritesPerSecond=0"], r"maxWritesPerSecond"),
    "bad-xid": (["--set-json", "ignoredXids=[\"thirteen\"]"], r"ignoredXids"),
    "unknown-key": (["--set", "gpuBakend=nvml"], r"gpuBakend|additional properties"),
    "old-kubernetes": (["--kube-version", "1.35.4"], r"1\.36"),
    "bad-consumable-shares": (["--set", "consumableShares=lots"], r"consumableShares"),
    "zero-consumable-shares": (["--set", "consumableShares=0"], r"consumableShares"),
    "http-probe-without-port": (["--set", "kubeletPlugin.probes.mode=http", "--set", "kubeletPlugin.healthPort=0"],
                                r"healthPort"),
    "monitoring-without-health-port": (["--set", "monitoring.enabled=true", "--set", "kubeletPlugin.healthPort=0",
                                        "--set", "kubeletPlugin.probes.mode=exec"], r"healthPort > 0"),
    "bad-cdi-hook-source": (["--set", "nvml.cdiHook.source=copy"], r"cdiHook/source"),
    "relative-cdi-hook-install-dir": (["--set", "nvml.cdiHook.installDir=bin"], r"cdiHook/installDir"),
    "bad-device-metadata": (["--set", "deviceMetadata.enabled=maybe"], r"deviceMetadata"),
    "bad-scrape-interval": (["--set", "monitoring.interval=often"], r"interval"),
    "controller-allocation-without-namespaces": (["--set", "controller.allocation.enabled=true",
                                                  "--set", "controller.allocation.namespaceSelector= "],
                                                 r"controller.allocation.namespaceSelector"),
    "replicas-without-leader-election": (["--set", "controller.replicas=2", "--set", "controller.leaderElection.enabled=false"],
                                         r"leaderElection"),
}


def cache_dir() -> Path:
    return gotools.bin_dir(["helm"])


def _run(cmd: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), cwd=cwd, env=env, text=True, capture_output=True, check=False)


def build(log: bool = True) -> Path:
    return gotools.ensure(["helm"], log=log) / "helm"


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
        proc = template(helm, ["--kube-version", "1.35.4"], env, chart=loose)
        if proc.returncode == 0 or "needs Kubernetes 1.36 or newer" not in proc.stderr:
            failures.append(f"template guard did not reject Kubernetes 1.35: rc={proc.returncode} {proc.stderr[-300:]}")
            print("reject template-guard-1.35: FAIL")
        else:
            print("reject template-guard-1.35: ok (template fail message)")
    if failures:
        print("\n".join(["", "FAILURES:", *failures]), file=sys.stderr)
        return 1
    print("helm checks: all passed")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print-path", action="store_true", help="build if needed, print the helm path, exit")
    parser.add_argument("--skip-if-no-go", action="store_true", help="exit 0 when Go is unavailable and helm is not cached")
    args = parser.parse_args(argv)
    if args.skip_if_no_go and shutil.which("go") is None and not (cache_dir() / "helm").exists():
        print("helm checks: skipped (no Go toolchain and no cached helm)")
        return 0
    helm = build(log=not args.print_path)
    if args.print_path:
        print(helm)
        return 0
    return run_checks(helm)


if __name__ == "__main__":
    sys.exit(main())
