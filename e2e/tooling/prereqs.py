"""What a machine needs before ``make test`` or ``make demo``, checked in a second, named by package.

A fresh Debian machine with Go and Python has most of it; the rest are Debian packages. Checking
first means a missing one stops the run at once with the ``apt-get install`` line to fix it, rather
than twenty minutes into a build, or as a skipped check that nobody reads.

    python -m e2e.tooling.prereqs test   # everything make test uses
    python -m e2e.tooling.prereqs demo   # what make demo uses
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from e2e.tooling import gotools

GO_INSTALL = "https://go.dev/doc/install"


def _go_problem() -> str | None:
    """Go must be at least the newest ``go`` line among the pins (readonly builds cannot switch toolchain),
    except those of a tool that names its own toolchain: the go command fetches that one."""
    if shutil.which("go") is None:
        return f"the Go toolchain (go) is not on PATH: {GO_INSTALL}"
    have = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=False).stdout.strip()
    need = max((_go_line(t.folder / "go.mod") for t in gotools.TOOLS.values() if not t.toolchain), key=_version_tuple)
    if _version_tuple(have.removeprefix("go")) < _version_tuple(need):
        return f"Go {need} or newer is needed by the pinned tools; this machine has {have}: {GO_INSTALL}"
    return None


def _go_line(gomod: Path) -> str:
    match = re.search(r"^go\s+(\S+)", gomod.read_text(), re.M)
    return match.group(1) if match else "1.0"


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def find_busybox() -> Path:
    """The static busybox from Debian's busybox-static (a dynamic one would need its libraries)."""
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        path = Path(candidate)
        if path.exists():
            out = subprocess.run(["file", "-L", str(path)], capture_output=True, text=True, check=False).stdout \
                if shutil.which("file") else "statically linked"
            if "statically linked" in out or "static-pie" in out:
                return path
    raise RuntimeError("a static busybox is needed for the real node's images: apt-get install -y busybox-static")


def _static_busybox() -> bool:
    try:
        find_busybox()
    except RuntimeError:
        return False
    return True


def _libseccomp() -> bool:
    return shutil.which("pkg-config") is not None and subprocess.run(
        ["pkg-config", "--exists", "libseccomp"], check=False).returncode == 0


# (Debian package, present?, what needs it)
CHECKS: dict[str, list[tuple[str, Callable[[], bool], str]]] = {
    "demo": [],  # the control plane builds without cgo: Go alone
    "test": [
        ("gcc", lambda: shutil.which("gcc") is not None, "building runc (cgo)"),
        ("pkg-config", lambda: shutil.which("pkg-config") is not None, "finding libseccomp for runc"),
        ("libseccomp-dev", _libseccomp, "runc with seccomp: containerd gives every pod a seccomp profile"),
        ("file", lambda: shutil.which("file") is not None, "checking that busybox is static"),
        ("busybox-static", _static_busybox, "the real node's container images"),
        ("shellcheck", lambda: shutil.which("shellcheck") is not None, "linting the kind and CI scripts"),
        ("docker.io", lambda: Path("/usr/sbin/dockerd").exists() and Path("/usr/bin/docker").exists(),
         "the image build and the kind cluster (the bed starts its own dockerd)"),
        ("mmdebstrap", lambda: shutil.which("mmdebstrap") is not None,
         "Debian base images made offline (no image registry is reachable)"),
    ],
}


def missing_packages(purpose: str) -> list[tuple[str, str]]:
    """(Debian package, what needs it) for each one this machine lacks."""
    return [(pkg, why) for pkg, present, why in CHECKS[purpose] if not present()]


def problems(purpose: str) -> list[str]:
    found = []
    go = _go_problem()
    if go:
        found.append(go)
    missing = missing_packages(purpose)
    if missing:
        found += [f"{pkg}: needed for {why}" for pkg, why in missing]
        found.append("install them with: apt-get install -y " + " ".join(pkg for pkg, _ in missing))
    if purpose == "test" and os.geteuid() != 0:
        found.append(f"the real node (containerd, runc, kubelet) needs root; running as uid {os.geteuid()}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check this machine's prerequisites, naming what is missing.")
    parser.add_argument("purpose", choices=sorted(CHECKS))
    parser.add_argument("--print-missing-packages", action="store_true",
                        help="print the missing Debian packages, space-separated, and exit 0 (for .ci/run)")
    args = parser.parse_args(argv)
    if args.print_missing_packages:
        print(" ".join(pkg for pkg, _ in missing_packages(args.purpose)))
        return 0
    found = problems(args.purpose)
    if found:
        print(f"make {args.purpose}: this machine lacks what it needs:\n  " + "\n  ".join(found), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
