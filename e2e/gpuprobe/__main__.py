"""Assemble ``.gpuprobe/``: what the probe needs on a GPU machine that cannot fetch anything.

* ``bin/``: nvidia-ctk and nvidia-cdi-hook (the toolkit the plugin runs), cdi-validate (the reference
  CDI library's injection, as containerd does it), runc with its libseccomp; all from their pins.
* ``rootfs/``: a container's root: busybox, ldconfig, this machine's glibc and ``cudacheck``, which
  loads libcuda.so.1 as any CUDA program does. Nothing of the driver: that is the CDI spec's job.
* ``whl/``: the plugin's Python needs the GPU machine's image lacks, at the versions of this venv.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

from e2e.tooling import gotools

HERE = Path(__file__).resolve().parent
OUT = HERE.parents[1] / ".gpuprobe"
GLIBC = ("libc.so.6", "libdl.so.2", "libpthread.so.0", "libm.so.6", "librt.so.1")
LIB = Path("/lib/x86_64-linux-gnu")
MISSING_ON_THE_GPU_MACHINE = ("structlog", "orjson")


def rootfs(root: Path) -> None:
    for d in ("bin", "sbin", "lib/x86_64-linux-gnu", "lib64", "etc/ld.so.conf.d", "tmp", "proc", "sys", "dev",
              "usr/bin", "usr/lib/x86_64-linux-gnu", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy(shutil.which("busybox") or "/usr/bin/busybox", root / "bin/busybox")
    (root / "bin/sh").symlink_to("busybox")
    shutil.copy("/usr/sbin/ldconfig", root / "sbin/ldconfig")
    for name in GLIBC:
        shutil.copy(LIB / name, root / "lib/x86_64-linux-gnu" / name)
    shutil.copy("/lib64/ld-linux-x86-64.so.2", root / "lib64/ld-linux-x86-64.so.2")
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.conf.d/x86_64-linux-gnu.conf").write_text("/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    subprocess.run(["gcc", "-O2", "-o", str(root / "cudacheck"), str(HERE / "cudacheck.c"), "-ldl"], check=True)


def tools(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True)
    for names, files in ((["nvidia-container-toolkit"], ("nvidia-ctk", "nvidia-cdi-hook")),
                         (["cdi-validate"], ("cdi-validate",)), (["containerd", "runc"], ("runc",))):
        folder = gotools.ensure(names)
        for f in files:
            shutil.copy(folder / f, bin_dir / f)
    shutil.copy(LIB / "libseccomp.so.2", bin_dir / "libseccomp.so.2")


def wheels(whl: Path) -> None:
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in MISSING_ON_THE_GPU_MACHINE]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                    "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "-d", str(whl), *pins],
                   check=True)


def main() -> int:
    shutil.rmtree(OUT, ignore_errors=True)
    tools(OUT / "bin")
    rootfs(OUT / "rootfs")
    wheels(OUT / "whl")
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
