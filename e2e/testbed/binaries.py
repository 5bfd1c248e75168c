"""The real Kubernetes control plane, kubelet and etcd for the test bed, built from their pins.

Both come from committed Go modules (``e2e/testbed/gotools/{kubernetes,etcd}``), built by
``gotools`` with ``-mod=readonly`` and cached under a key that hashes the pins.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from e2e.testbed import gotools

TOOLS = ("kubernetes", "etcd")


def kubernetes_version() -> str:
    """The pinned Kubernetes release, e.g. ``v1.36.3``."""
    return gotools.TOOLS["kubernetes"].version()


def bin_dir() -> Path:
    return gotools.bin_dir(TOOLS)


def ensure(log: bool = True) -> Path:
    """Return the directory holding every binary, building what is missing."""
    return gotools.ensure(TOOLS, log=log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build or locate the cached Kubernetes test-bed binaries.")
    parser.add_argument("--print-dir", action="store_true", help="print the binary directory and exit")
    args = parser.parse_args(argv)
    out = ensure(log=not args.print_dir)
    if args.print_dir:
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
