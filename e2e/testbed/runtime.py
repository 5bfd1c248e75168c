"""Build and cache a CDI-capable container runtime for the test bed's real node.

Like ``binaries.py`` for Kubernetes, everything comes through the Go module proxy: a throwaway Go
module requires the pinned release and ``go build`` produces

* ``containerd``, ``ctr`` and ``containerd-shim-runc-v2`` from ``github.com/containerd/containerd/v2``
  (CGO off: the btrfs snapshotter and other cgo-only pieces are left out, overlayfs/native stay);
* ``runc`` from ``github.com/opencontainers/runc`` (cgo with libseccomp when ``libseccomp-dev``
  is installed, otherwise built without the ``seccomp`` tag; a ``runc`` on ``PATH`` is the last
  resort);
* the CNI ``loopback``, ``bridge`` and ``host-local`` plugins from
  ``github.com/containernetworking/plugins``: the kubelet keeps a node NotReady until the runtime
  reports its network ready. (``dummy`` would touch nothing on the host, but this kernel has no
  dummy link type: ``ip link add t0 type dummy`` -> "Unknown device type"; veth and bridge work.)

``ensure()`` returns the directory; ``binaries.ensure()`` is untouched.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from e2e.testbed import binaries

CONTAINERD_VERSION = "v2.4.2"
RUNC_VERSION = "v1.4.3"
CNI_PLUGINS_VERSION = "v1.9.1"
CONTAINERD_COMMANDS = ("containerd", "ctr", "containerd-shim-runc-v2")
CNI_PLUGINS = ("loopback", "bridge", "host-local")
ALL_BINARIES = (*CONTAINERD_COMMANDS, "runc")


def bin_dir() -> Path:
    return binaries.cache_root() / f"runtime-containerd-{CONTAINERD_VERSION}-runc-{RUNC_VERSION}" / "bin"


def cni_bin_dir() -> Path:
    return bin_dir().parent / f"cni-{CNI_PLUGINS_VERSION}"


def _nice() -> list[str]:
    # Other beds build and run on the same machine.
    return ["nice", "-n", "10"] if shutil.which("nice") else []


def _write_module(work: Path, require: str, version: str, imports: list[str]) -> None:
    work.mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text(
        f"module dra-driver.local/testbed-runtime-build\n\ngo 1.25\n\nrequire {require} {version}\n"
    )
    body = "\n".join(f'\t_ "{imp}"' for imp in imports)
    (work / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{body}\n)\n")


def _build(work: Path, targets: list[str], out: Path, env: dict[str, str], tags: str = "",
           ldflags: str = "-s -w") -> None:
    binaries._run([*_nice(), "go", "mod", "tidy", "-e"], work, env)
    cmd = [*_nice(), "go", "build", "-trimpath", "-ldflags", ldflags]
    if tags:
        cmd += ["-tags", tags]
    binaries._run([*cmd, "-o", str(out) + "/", *targets], work, env)


def build_containerd(out: Path, log: bool) -> None:
    work = out.parent / "build-containerd"
    env = binaries._go_env()
    env["CGO_ENABLED"] = "0"
    mod = "github.com/containerd/containerd/v2"
    targets = [f"{mod}/cmd/{name}" for name in CONTAINERD_COMMANDS]
    _write_module(work, mod, CONTAINERD_VERSION, targets)
    if log:
        print(f"testbed: building containerd {CONTAINERD_VERSION} (containerd, ctr, shim)", flush=True)
    ver = f"-X {mod}/version.Version={CONTAINERD_VERSION} -X {mod}/version.Revision=testbed"
    _build(work, targets, out, env, tags="no_btrfs no_devmapper no_zfs", ldflags=f"-s -w {ver}")


def _have_libseccomp() -> bool:
    return subprocess.run(["pkg-config", "--exists", "libseccomp"], check=False).returncode == 0 \
        if shutil.which("pkg-config") else False


def build_runc(out: Path, log: bool) -> str:
    """Build runc; returns how (``seccomp`` / ``no-seccomp`` / ``system``)."""
    work = out.parent / "build-runc"
    env = binaries._go_env()
    mod = "github.com/opencontainers/runc"
    _write_module(work, mod, RUNC_VERSION, [mod])
    if shutil.which("gcc") and _have_libseccomp():
        env["CGO_ENABLED"] = "1"
        tags, how = "seccomp urfave_cli_no_docs", "seccomp"
    elif shutil.which("gcc"):
        env["CGO_ENABLED"] = "1"  # runc's nsenter needs cgo even without seccomp
        tags, how = "urfave_cli_no_docs", "no-seccomp"
    else:
        system = shutil.which("runc")
        if not system:
            raise SystemExit("testbed: building runc needs gcc (and libseccomp-dev); none found and no runc on PATH")
        shutil.copy2(system, out / "runc")
        return "system"
    if log:
        print(f"testbed: building runc {RUNC_VERSION} ({how})", flush=True)
    _build(work, [mod], out, env, tags=tags, ldflags=f"-s -w -X main.version={RUNC_VERSION.lstrip('v')}")
    return how


def build_cni(out: Path, log: bool) -> None:
    work = out.parent / "build-cni"
    env = binaries._go_env()
    env["CGO_ENABLED"] = "0"
    mod = "github.com/containernetworking/plugins"
    targets = [f"{mod}/plugins/main/{p}" if p != "host-local" else f"{mod}/plugins/ipam/host-local"
               for p in CNI_PLUGINS]
    _write_module(work, mod, CNI_PLUGINS_VERSION, targets)
    if log:
        print(f"testbed: building CNI plugins {CNI_PLUGINS_VERSION} ({', '.join(CNI_PLUGINS)})", flush=True)
    _build(work, targets, out, env)


def ensure(log: bool = True) -> Path:
    """Return the directory holding containerd, ctr, the runc shim and runc, building what is missing."""
    out = bin_dir()
    stamp = out / ".complete"
    cni = cni_bin_dir()
    if stamp.exists() and all((out / b).exists() for b in ALL_BINARIES) \
            and all((cni / p).exists() for p in CNI_PLUGINS):
        return out
    if shutil.which("go") is None:
        raise SystemExit("testbed: the Go toolchain is required to build containerd and runc (install Go >= 1.25)")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    timings: dict[str, float] = {}
    if not all((out / b).exists() for b in CONTAINERD_COMMANDS):
        t = time.monotonic()
        build_containerd(out, log)
        timings["containerd"] = round(time.monotonic() - t, 1)
    how = "cached"
    if not (out / "runc").exists():
        t = time.monotonic()
        how = build_runc(out, log)
        timings["runc"] = round(time.monotonic() - t, 1)
    if not all((cni / p).exists() for p in CNI_PLUGINS):
        cni.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        build_cni(cni, log)
        timings["cni"] = round(time.monotonic() - t, 1)
    previous = json.loads(stamp.read_text()) if stamp.exists() else {}
    if how == "cached":
        how = previous.get("runc_build", how)
    stamp.write_text(json.dumps({"containerd": CONTAINERD_VERSION, "runc": RUNC_VERSION, "runc_build": how,
                                 "cni": CNI_PLUGINS_VERSION,
                                 "build_seconds": {**previous.get("build_seconds", {}), **timings}}))
    if log:
        print(f"testbed: runtime ready in {out} after {time.monotonic() - started:.0f}s {timings}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build or locate the cached containerd/runc/CNI binaries.")
    parser.add_argument("--print-dir", action="store_true", help="print the binary directory and exit")
    args = parser.parse_args(argv)
    out = ensure(log=not args.print_dir)
    if args.print_dir:
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
