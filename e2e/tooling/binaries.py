"""The real Kubernetes control plane, kubelet and etcd for the test bed, built from their pins.

Both come from committed Go modules (``e2e/tooling/gotools/{kubernetes,kubernetes-1.36,etcd}``),
built by ``gotools`` with ``-mod=readonly`` and cached under a key that hashes the pins.

The bed runs the current minor; ``DRA_TESTBED_KUBERNETES=1.36`` makes it run the oldest supported
minor instead (``make e2e-oldest`` runs the smoke subset that way).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from e2e.tooling import gotools

# Supported minors -> the gotools tool that pins them; the first is the default.
MINORS = {"1.37": "kubernetes", "1.36": "kubernetes-1.36"}
MINOR_ENV = "DRA_TESTBED_KUBERNETES"


def kubernetes_tool() -> str:
    minor = os.environ.get(MINOR_ENV) or next(iter(MINORS))
    if minor not in MINORS:
        raise gotools.ToolError(f"{MINOR_ENV}={minor!r} is not a supported minor; use one of {', '.join(MINORS)}")
    return MINORS[minor]


def tools() -> tuple[str, str]:
    return kubernetes_tool(), "etcd"


def kubernetes_version() -> str:
    """The Kubernetes release the bed runs, e.g. ``v1.37.2``."""
    return gotools.TOOLS[kubernetes_tool()].version()


def bin_dir() -> Path:
    return gotools.bin_dir(tools())


def ensure(log: bool = True) -> Path:
    """Return the directory holding every binary, building what is missing."""
    return gotools.ensure(tools(), log=log)


def main(argv: list[str] | None = None) -> int:
    return gotools.ensure_command(ensure, "Build or locate the cached Kubernetes test-bed binaries.", argv)


if __name__ == "__main__":
    sys.exit(main())
