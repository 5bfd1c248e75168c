"""Build the dra-driver image (``make image``), also where no image registry can be reached.

    python deploy/image/build.py [--tag dra-driver:dev] [--ca-bundle FILE]

It builds ``deploy/image/Dockerfile`` with Docker, or with Podman where that is what the host has.
Two inputs of that Dockerfile are images from a registry; where one cannot be pulled, an equivalent
is made locally:

* ``PYTHON_IMAGE`` (``python:3.12-slim``) becomes a Debian bookworm minbase with ``python3`` and
  ``python3-venv``, made with ``mmdebstrap`` from Debian's mirror;
* the toolkit stage's ``GO_IMAGE`` is replaced by an image holding ``nvidia-ctk`` and ``nvidia-cdi-hook``
  built on the host from the same pins (``e2e/tooling/gotools/nvidia-container-toolkit``), so the
  image ships the same pinned toolkit either way.

``--ca-bundle`` (default: the system bundle, when the host has one) is handed to the build as a
BuildKit secret: pip and the Go build trust it while the image is built (for a proxy that intercepts
TLS), and no layer of the image contains it.

The script ends with a smoke run of the image (``dra-driver --version``, ``nvidia-ctk --version``) and
prints its size.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from e2e.testbed import docker as bed_docker  # noqa: E402  (the repository root is put on sys.path above)
from e2e.tooling import gotools  # noqa: E402

DOCKERFILE = ROOT / "deploy" / "image" / "Dockerfile"
DEFAULT_PYTHON_IMAGE = "python:3.12-slim"
DEFAULT_GO_IMAGE = "golang:1.26-trixie"
DEBIAN_PYTHON_PACKAGES = ("python3", "python3-venv", "ca-certificates")
TOOLKIT_TOOL = "nvidia-container-toolkit"
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


class BuildError(SystemExit):
    pass


def engine() -> str:
    """docker (the bed's private daemon when DOCKER_HOST points at it), else podman."""
    for name in ("docker", "podman"):
        path = shutil.which(name)
        if path:
            return path
    raise BuildError("make image: neither docker nor podman is on PATH")


def run(cmd: list[str], *, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, text=True, capture_output=quiet, check=False)
    if check and proc.returncode != 0:
        detail = (proc.stderr or "").strip()[-1500:] if quiet else "(see the output above)"
        raise BuildError(f"make image: {' '.join(cmd[:3])} failed (exit {proc.returncode}): {detail}")
    return proc


def available(eng: str, image: str) -> bool:
    """The image is local, or a pull of it succeeds."""
    if run([eng, "image", "inspect", image], check=False, quiet=True).returncode == 0:
        return True
    return run([eng, "pull", "-q", image], check=False, quiet=True).returncode == 0


def toolkit_image(eng: str) -> str:
    """An image with /out/nvidia-ctk and /out/nvidia-cdi-hook from the host's pinned build."""
    folder = gotools.ensure([TOOLKIT_TOOL])
    tag = f"dra-driver.local/nvidia-toolkit:{folder.name.rsplit('-', 1)[-1]}"
    if run([eng, "image", "inspect", tag], check=False, quiet=True).returncode == 0:
        return tag
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("nvidia-ctk", "nvidia-cdi-hook"):
            info = tar.gettarinfo(str(folder / name), arcname=f"out/{name}")
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            with (folder / name).open("rb") as f:
                tar.addfile(info, f)
    proc = subprocess.run([eng, "import", "-", tag], input=buf.getvalue(), capture_output=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"make image: importing the toolkit image failed: {proc.stderr.decode(errors='replace')}")
    return tag


def python_image(eng: str, wanted: str | None) -> str:
    if wanted:
        return wanted
    if available(eng, DEFAULT_PYTHON_IMAGE):
        return DEFAULT_PYTHON_IMAGE
    print(f"make image: {DEFAULT_PYTHON_IMAGE} cannot be pulled; making a Debian {bed_docker.SUITE} base "
          f"with {', '.join(DEBIAN_PYTHON_PACKAGES)} (mmdebstrap)", file=sys.stderr)
    return bed_docker.debian_image(DEBIAN_PYTHON_PACKAGES)


def image_size_mb(eng: str, tag: str) -> float:
    out = run([eng, "image", "inspect", "--format", "{{.Size}}", tag], quiet=True).stdout.strip()
    return int(out) / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the dra-driver image (offline-capable).")
    parser.add_argument("--tag", default=os.environ.get("IMAGE", "dra-driver:dev"))
    parser.add_argument("--python-image", help=f"base image for both Python stages (default {DEFAULT_PYTHON_IMAGE}, "
                        "or a Debian base made with mmdebstrap when that cannot be pulled)")
    parser.add_argument("--ca-bundle", type=Path, default=Path(os.environ["CA_BUNDLE"]) if os.environ.get("CA_BUNDLE")
                        else (SYSTEM_CA_BUNDLE if SYSTEM_CA_BUNDLE.exists() else None),
                        help="extra CA bundle trusted during the build only (a BuildKit secret; default: the "
                        "system bundle)")
    args = parser.parse_args(argv)
    eng = engine()
    started = time.monotonic()
    base = python_image(eng, args.python_image)
    toolkit = "toolkit-build" if available(eng, DEFAULT_GO_IMAGE) else toolkit_image(eng)
    cmd = [eng, "build", "--network", "host", "-f", str(DOCKERFILE), "-t", args.tag,
           "--build-arg", f"PYTHON_IMAGE={base}", "--build-arg", f"TOOLKIT_IMAGE={toolkit}"]
    if args.ca_bundle is not None:
        if not args.ca_bundle.is_file():
            raise BuildError(f"make image: the CA bundle {args.ca_bundle} does not exist")
        cmd += ["--secret", f"id=ca,src={args.ca_bundle}"]
    env_note = "" if os.environ.get("DOCKER_BUILDKIT") == "1" or "podman" in eng else " (set DOCKER_BUILDKIT=1)"
    print(f"make image: {' '.join(cmd)} {ROOT}{env_note}", file=sys.stderr)
    run([*cmd, str(ROOT)])
    version = run([eng, "run", "--rm", args.tag, "--version"], quiet=True).stdout.strip()
    ctk = run([eng, "run", "--rm", "--entrypoint", "nvidia-ctk", args.tag, "--version"], quiet=True).stdout
    ctk_line = ctk.strip().splitlines()[0] if ctk.strip() else "?"
    print(f"make image: {args.tag} built in {time.monotonic() - started:.0f} s from {base}: {version}; {ctk_line}; "
          f"{image_size_mb(eng, args.tag):.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
