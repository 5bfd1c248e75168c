"""A private Docker daemon for the image build and the kind cluster, and Debian base images made offline.

The bed never uses (or needs) the machine's own Docker service. It starts Debian's ``dockerd`` with its
own data root (kept between runs: it is the image cache), its own exec root and socket, no default
bridge and no iptables rules, so nothing it does reaches the host's networking: kind's nodes live on
a Docker network of their own and the API server is published on loopback by docker-proxy.

Two things about this machine shape it:

* ``docker run --privileged`` fails with "unable to apply caps: operation not permitted": the
  machine's capability bounding set lacks ``CAP_SYS_RESOURCE`` and Docker 20.10 grants every
  capability it knows to a privileged container. kind starts its nodes privileged. So dockerd's
  default OCI runtime is a wrapper (:data:`CAPWRAP`) that drops, from the container's config, the
  capabilities this machine cannot grant, then runs runc. Test-bed code only; a normal host needs none
  of it, and ``e2e/suites/kind/run-e2e.sh`` uses whatever Docker a host already has.
* No image registry is reachable, so base images come from Debian's package mirror: a minbase
  rootfs made with ``mmdebstrap`` and ``docker import``-ed (:func:`debian_image`), cached by a hash of
  its recipe.

Usage::

    python -m e2e.testbed.docker up          # start (or find) the daemon; prints DOCKER_HOST=...
    python -m e2e.testbed.docker env         # print the environment lines for a shell: eval "$(...)"
    python -m e2e.testbed.docker down        # stop it; the data root (image cache) stays
    python -m e2e.testbed.docker debian python3 python3-venv   # build or find a Debian base image
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from e2e.testbed import pids
from e2e.tooling import gotools

# Debian's dockerd 20.10 and its own CLI: that CLI still builds with BuildKit built in (secrets,
# build args naming stages), which a newer CLI without the buildx plugin no longer does.
DOCKERD = "/usr/sbin/dockerd"
DEBIAN_DOCKER = "/usr/bin/docker"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
STOP_TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0

# Capability names by number (linux/capability.h), for reading the bounding set's bit mask.
CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
    "CHECKPOINT_RESTORE",
)


class DockerError(SystemExit):
    """The daemon or an image step failed; the message names the step and what to do."""


def state_dir() -> Path:
    """Data root and logs: kept between runs, since the data root is the image cache."""
    return gotools.cache_root() / "dra-driver-docker"


def exec_root() -> Path:
    # Short and on /run: dockerd's and containerd's sockets live here (UNIX socket paths are short).
    return Path(os.environ.get("DRA_DOCKER_EXEC_ROOT", "/run/dra-driver-docker"))


def socket_path() -> Path:
    return exec_root() / "docker.sock"


def docker_host() -> str:
    return f"unix://{socket_path()}"


def bin_dir() -> Path:
    """A folder put first on PATH so that ``docker`` (for kind and scripts) is Debian's CLI."""
    return exec_root() / "bin"


def docker_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["DOCKER_HOST"] = docker_host()
    env["PATH"] = f"{bin_dir()}:{env.get('PATH', '')}"
    env.pop("DOCKER_CONTEXT", None)
    env["DOCKER_BUILDKIT"] = "1"
    return env


def docker(*args: str, check: bool = True, capture: bool = True, input_bytes: bytes | None = None,
           timeout: float | None = None) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run([DEBIAN_DOCKER, *args], env=docker_env(), capture_output=capture, input=input_bytes,
                          check=False, timeout=timeout)
    if check and proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip() if capture else ""
        raise DockerError(f"docker {' '.join(args[:3])} failed (exit {proc.returncode}): {err}")
    return proc


def bounding_set() -> set[str]:
    """Capabilities this machine lets a process hold (CapBnd of our own status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            mask = int(line.split()[1], 16)
            return {f"CAP_{name}" for bit, name in enumerate(CAPABILITIES) if mask >> bit & 1}
    raise DockerError("docker: /proc/self/status has no CapBnd line")


# The OCI runtime wrapper. It must be a standalone program (containerd's shim runs it with a bare
# environment), so it is written out with this machine's Python as its interpreter.
CAPWRAP = r'''
import json, os, sys

ALLOWED = set(json.loads(%(allowed)r))


def _filter(process):
    caps = process.get("capabilities") or {}
    for kind, names in list(caps.items()):
        caps[kind] = [n for n in names if n in ALLOWED]


def _edit(path, is_process):
    with open(path) as f:
        doc = json.load(f)
    _filter(doc if is_process else doc.get("process") or {})
    tmp = path + ".capwrap"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


args = sys.argv[1:]
for i, arg in enumerate(args):
    if arg in ("--bundle", "-b") and i + 1 < len(args):
        _edit(os.path.join(args[i + 1], "config.json"), False)
    elif arg.startswith("--bundle="):
        _edit(os.path.join(arg.split("=", 1)[1], "config.json"), False)
    elif arg in ("--process", "-p") and i + 1 < len(args):
        _edit(args[i + 1], True)
os.execv(%(runc)r, [%(runc)r] + args)
'''


def _write_capwrap() -> Path:
    runc = shutil.which("runc") or "/usr/sbin/runc"
    path = exec_root() / "capwrap-runc"
    text = f"#!{sys.executable}\n" + CAPWRAP % {"allowed": json.dumps(sorted(bounding_set())), "runc": runc}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.chmod(0o755)
    tmp.replace(path)
    return path


def _daemon_config() -> Path:
    # An explicit (empty-ish) config so that a host's /etc/docker/daemon.json never applies.
    path = exec_root() / "daemon.json"
    path.write_text(json.dumps({"features": {"buildkit": True}}))
    return path


def _pidfile() -> Path:
    return exec_root() / "dockerd.pid"


def _identity_file() -> Path:
    """The daemon this bed started (:class:`pids.Identity`), beside the pid file dockerd writes."""
    return exec_root() / "dockerd.identity"


def responding() -> bool:
    if not socket_path().exists():
        return False
    return docker("version", "--format", "{{.Server.Version}}", check=False, timeout=20).returncode == 0


def up() -> dict[str, str]:
    """Start the private daemon unless it already answers; returns the environment to reach it."""
    if not Path(DOCKERD).exists():
        raise DockerError(f"docker: {DOCKERD} not found; install Debian's Docker: apt-get install -y docker.io")
    exec_root().mkdir(mode=0o700, parents=True, exist_ok=True)
    bin_dir().mkdir(exist_ok=True)
    link = bin_dir() / "docker"
    if not link.is_symlink():
        link.symlink_to(DEBIAN_DOCKER)
    if responding():
        return docker_env()
    data = state_dir() / "data"
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    log = state_dir() / "dockerd.log"
    wrapper = _write_capwrap()
    cmd = [DOCKERD, "--config-file", str(_daemon_config()), "--data-root", str(data),
           "--exec-root", str(exec_root() / "exec"), "--pidfile", str(_pidfile()), "-H", docker_host(),
           "--iptables=false", "--ip6tables=false", "--bridge=none", "--ip-masq=false",
           "--storage-driver=overlay2", "--add-runtime", f"capwrap={wrapper}", "--default-runtime", "capwrap",
           "--log-level", "warn"]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PATH": f"{bin_dir()}:{os.environ.get('PATH', '')}"})
    started = pids.identify(proc.pid)
    if started is not None:  # else it died at once: the wait below reports its log
        _identity_file().write_text(json.dumps(started.to_json()))
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if responding():
            return docker_env()
        time.sleep(0.5)
    tail = log.read_text(errors="replace").splitlines()[-15:]
    raise DockerError("docker: dockerd did not answer within {:.0f} s; last lines of {}:\n  {}".format(
        START_TIMEOUT_S, log, "\n  ".join(tail)))


def _started_daemon(pid: int) -> pids.Identity | None:
    """The dockerd at ``pid`` if this bed started it; None for any other process."""
    try:
        recorded = pids.from_json(json.loads(_identity_file().read_text()))
    except FileNotFoundError:
        # Started by a bed from before identities were recorded (the daemon outlives checkouts):
        # only a dockerd that writes this very pid file is ours.
        args = pids.command_line(pid) or []
        return pids.identify(pid) if args[:1] == [DOCKERD] and str(_pidfile()) in args else None
    except ValueError:
        return None
    return recorded if recorded is not None and recorded.pid == pid and pids.is_running(recorded) else None


def down() -> None:
    try:
        pid = int(_pidfile().read_text().strip())
    except (FileNotFoundError, ValueError):
        return
    if pids.start_time(pid) is None:
        return
    daemon = _started_daemon(pid)
    if daemon is None:
        print(f"docker: not stopping pid {pid} of {_pidfile()}: it is not the dockerd this bed started "
              f"(see {_identity_file()})", file=sys.stderr)
        return
    if not pids.send(daemon, signal.SIGTERM):
        return
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        if not pids.is_running(daemon):
            return
        time.sleep(0.3)
    pids.send(daemon, signal.SIGKILL)


def image_exists(tag: str) -> bool:
    return docker("image", "inspect", tag, check=False).returncode == 0


def debian_recipe_key(packages: Sequence[str], suite: str = SUITE, variant: str = "minbase") -> str:
    text = json.dumps({"suite": suite, "variant": variant, "packages": sorted(set(packages)), "mirror": MIRROR})
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def debian_image(packages: Sequence[str], suite: str = SUITE, variant: str = "minbase",
                 name: str = "dra-driver.local/debian") -> str:
    """A Debian ``suite`` image holding ``packages``, made with mmdebstrap from Debian's mirror.

    Cached as an image tagged with a hash of its recipe: the first call takes about half a minute,
    later ones a second.
    """
    tag = f"{name}:{suite}-{debian_recipe_key(packages, suite, variant)}"
    if image_exists(tag):
        return tag
    out = state_dir() / f"rootfs-{tag.rsplit(':', 1)[1]}.tar"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        mmdebstrap(packages, out, suite, variant)
    except DockerError:
        out.unlink(missing_ok=True)
        raise
    try:
        docker("import", "--change", "CMD [\"/bin/bash\"]", str(out), tag)
    finally:
        out.unlink(missing_ok=True)
    return tag


def mmdebstrap(packages: Sequence[str], target: Path, suite: str = SUITE, variant: str = "minbase",
               drop_logs: bool = False) -> None:
    """A Debian ``suite`` rootfs holding ``packages`` at ``target`` (a folder, or a tar by its name),
    without docs, man pages, locales, apt lists or caches (``drop_logs``: nor /var/log), as slim
    images are."""
    if shutil.which("mmdebstrap") is None:
        raise DockerError("docker: mmdebstrap is needed to make a Debian rootfs offline: apt-get install -y mmdebstrap")
    removed = '"$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' + (' "$1"/var/log/*' if drop_logs else "")
    cmd = ["mmdebstrap", f"--variant={variant}", "--quiet",
           # The mirror may serve a snapshot whose Release file has expired.
           "--aptopt=Acquire::Check-Valid-Until \"false\"", "--aptopt=Acquire::Check-Date \"false\"",
           f"--customize-hook=rm -rf {removed}",
           "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
           "--dpkgopt=path-exclude=/usr/share/locale/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright"]
    if packages:
        cmd.append("--include=" + ",".join(sorted(set(packages))))
    cmd += [suite, str(target), MIRROR]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise DockerError(f"docker: mmdebstrap {suite} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The bed's private Docker daemon and Debian base images.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", help="start the daemon (or find it running) and print DOCKER_HOST")
    sub.add_parser("env", help="print export lines for a shell")
    sub.add_parser("down", help="stop the daemon; its image cache stays")
    deb = sub.add_parser("debian", help="build or find a Debian base image and print its tag")
    deb.add_argument("packages", nargs="*")
    args = parser.parse_args(argv)
    if args.cmd == "up":
        env = up()
        print(f"DOCKER_HOST={env['DOCKER_HOST']}")
    elif args.cmd == "env":
        env = docker_env()
        print(f"export DOCKER_HOST={env['DOCKER_HOST']}\nexport PATH={env['PATH']}\nexport DOCKER_BUILDKIT=1")
    elif args.cmd == "down":
        down()
    else:
        up()
        print(debian_image(args.packages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
