"""A CDI-capable container runtime for the test bed's real node, built from its pins.

* ``containerd``, ``ctr`` and ``containerd-shim-runc-v2`` (CGO off: the btrfs snapshotter and
  other cgo-only pieces are left out, overlayfs/native stay);
* ``runc`` with libseccomp (containerd gives every sandbox a seccomp profile, so a runc without it
  cannot run a pod: the build refuses and names the missing package instead);
* the CNI ``loopback``, ``bridge`` and ``host-local`` plugins: the kubelet keeps a node NotReady
  until the runtime reports its network ready. (``dummy`` would touch nothing on the host, but this
  kernel has no dummy link type; veth and bridge work.)

Each comes from a committed Go module under ``e2e/tooling/gotools/`` (see ``gotools``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from e2e.tooling import gotools

RUNTIME_TOOLS = ("containerd", "runc")
CNI_TOOLS = ("cni-plugins",)


def bin_dir() -> Path:
    return gotools.bin_dir(RUNTIME_TOOLS)


def cni_bin_dir() -> Path:
    return gotools.bin_dir(CNI_TOOLS)


def ensure(log: bool = True) -> Path:
    """Return the directory holding containerd, ctr, the runc shim and runc, building what is missing."""
    out = gotools.ensure(RUNTIME_TOOLS, log=log)
    gotools.ensure(CNI_TOOLS, log=log)
    return out


def main(argv: list[str] | None = None) -> int:
    return gotools.ensure_command(ensure, "Build or locate the cached containerd/runc/CNI binaries.", argv)


if __name__ == "__main__":
    sys.exit(main())
