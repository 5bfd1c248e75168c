"""A kind node image assembled offline from the pinned, hermetic builds, and the ``kind`` CLI built pinned.

kind's own ``kind build node-image`` cannot run here: it pulls every image kubeadm needs with
``ctr content fetch``, and no image registry is reachable. So this module does what it does, from
parts that all come from committed pins (``e2e/tooling/gotools/``) or Debian's package mirror:

1. **Go builds** (``gotools``): kind, kubeadm/kube-proxy (``kubernetes-node``) beside the bed's own
   Kubernetes build, containerd/runc, crictl, the CNI plugins, etcd at kubeadm's version, CoreDNS
   with kubeadm's Corefile plugins only, our kindnetd, local-path-provisioner. ``pause`` is
   Kubernetes' own ``build/pause/linux/pause.c`` from the pinned module, compiled static with gcc.
2. **Component images** without a registry: a tar written here (binary, ``/etc/passwd``, ``/tmp``)
   and ``docker import``-ed with ENTRYPOINT/USER as upstream sets them; kube-proxy and kindnetd sit
   on a Debian image (iptables, nftables, conntrack) from ``docker.debian_image``. Each is named
   exactly as ``kubeadm config images list`` prints (or as our manifests refer to it).
3. **The base image**, following kind's ``images/base`` recipe read from the pinned kind module in
   the Go module cache: a Debian rootfs from mmdebstrap with that Dockerfile's package list, its
   ``files/``, its systemd tweaks, our containerd/runc/crictl/CNI plugins and ``cri-base.json``.
4. **The node image**, as kind's ``pkg/build/nodeimage``: a container from the base, kubeadm,
   kubelet and kubectl in ``/usr/bin``, ``/kind/version``, every image tar imported with ``ctr``
   (pinned, unpacked on first use), our CNI and storage manifests (``kindnode_manifests/``), then
   ``docker commit`` with the base's entrypoint.

Every stage is cached under a tag holding a hash of its inputs: the gotools cache folders (which are
themselves keyed by pins and recipe), the kind module's files, the manifests and :data:`RECIPE`.
An unchanged recipe finds the node image and returns in seconds.

Usage::

    python -m e2e.testbed.kindnode build    # prints KIND_NODE_IMAGE=<tag> and KIND=<path to kind>
    eval "$(python -m e2e.testbed.kindnode env)"   # exports KIND_NODE_IMAGE, KIND, KUBECTL, HELM
    python -m e2e.testbed.kindnode kind     # builds (or finds) kind only, prints its path

Build logs go to stderr; stdout has only those lines.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from e2e.testbed import docker
from e2e.tooling import gotools, prereqs, runtime
from e2e.tooling.toolsets import COREDNS_TOOL, CRICTL_TOOL, KIND_TOOL, KINDNET_TOOL, LOCAL_PATH_TOOL
from e2e.tooling.toolsets import KIND_ETCD_TOOL as ETCD_TOOL
from e2e.tooling.toolsets import KIND_NODE_TOOLS as NODE_TOOLS

RECIPE = "kindnode-1"
"""Bump when this module's recipe changes in a way the hashed inputs do not show."""

NAME_PREFIX = "dra-driver.local"
# The bed's own Kubernetes build (the same cache folder as ``binaries.ensure()``'s default), and
# kubeadm/kube-proxy at the same version in their own pins (NODE_TOOLS, with the other tools'
# names in e2e.tooling.toolsets).
K8S_TOOLS = ("kubernetes", "etcd")
CNI_PLUGINS = ("host-local", "loopback", "ptp", "portmap")
NET_PACKAGES = ("iptables", "nftables", "conntrack", "iproute2", "ipset", "kmod")
"""What kube-proxy and kindnetd execute (upstream bases them on distroless-iptables)."""
MANIFESTS = Path(__file__).resolve().parent / "kindnode_manifests"
NONROOT = "65532"  # distroless' nonroot, which CoreDNS' and the provisioner's upstream images use
CAP_NET_BIND_SERVICE = 10


class KindNodeError(SystemExit):
    """A step of the node image build failed; the message names it."""


def _log(message: str) -> None:
    print(f"kindnode: {message}", file=sys.stderr, flush=True)


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _run(cmd: Sequence[str], what: str, env: dict[str, str] | None = None, **kwargs: object) -> str:
    proc = subprocess.run(list(cmd), env=env, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise KindNodeError(f"kindnode: {what} failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return str(proc.stdout)


def _docker(*args: str, what: str) -> str:
    return _run([docker.DEBIAN_DOCKER, *args], what, env=docker.docker_env())


@contextlib.contextmanager
def _timed(step: str, timings: dict[str, float]) -> Iterator[None]:
    started = time.monotonic()
    yield
    timings[step] = round(time.monotonic() - started, 1)
    _log(f"{step}: {timings[step]}s")


# --- step 1: the binaries -------------------------------------------------------------------------

def kubernetes_version() -> str:
    """The bed's Kubernetes; kubeadm/kube-proxy must be pinned at the same one."""
    version = gotools.TOOLS[K8S_TOOLS[0]].version()
    node = gotools.TOOLS[NODE_TOOLS[0]].version()
    if node != version:
        raise KindNodeError(f"kindnode: {NODE_TOOLS[0]} is pinned at {node} but {K8S_TOOLS[0]} at {version}; "
                            f"re-pin it: python -m e2e.tooling.gotools pin {NODE_TOOLS[0]}@{version}")
    return version


def kind_binary(log: bool = True) -> Path:
    return gotools.ensure([KIND_TOOL], log=log) / "kind"


def module_dir(tool: str, module: str) -> Path:
    """Where a module pinned by a tool's go.sum sits in the Go module cache (downloaded if not yet)."""
    out = _run(["go", "mod", "download", "-json", module], f"finding {module}", env=gotools.go_env(),
               cwd=gotools.TOOLS[tool].folder)
    return Path(json.loads(out)["Dir"])


@dataclass(frozen=True)
class Binaries:
    """Every binary folder of the node, each a gotools cache folder named by its pins' hash."""

    kubernetes: Path
    node: Path
    runtime: Path
    cni: Path
    crictl: Path
    etcd: Path
    coredns: Path
    kindnet: Path
    local_path: Path
    pause: Path


def ensure_binaries(timings: dict[str, float]) -> Binaries:
    def build(names: Sequence[str]) -> Path:
        with _timed("go build " + "+".join(names), timings):
            return gotools.ensure(names, log=True)

    return Binaries(kubernetes=build(K8S_TOOLS), node=build(NODE_TOOLS), runtime=build(runtime.RUNTIME_TOOLS),
                    cni=build(runtime.CNI_TOOLS), crictl=build([CRICTL_TOOL]), etcd=build([ETCD_TOOL]),
                    coredns=build([COREDNS_TOOL]), kindnet=build([KINDNET_TOOL]),
                    local_path=build([LOCAL_PATH_TOOL]), pause=pause_binary())


def kubeadm_constant(name: str) -> str:
    """A version constant of the pinned kubeadm (cmd/kubeadm/app/constants), read from its source."""
    source = module_dir(NODE_TOOLS[0], "k8s.io/kubernetes") / "cmd/kubeadm/app/constants/constants.go"
    for line in source.read_text().splitlines():
        parts = line.split("=", 1)
        if len(parts) == 2 and parts[0].strip() == name:
            return parts[1].strip().strip('"')
    raise KindNodeError(f"kindnode: {source} has no constant {name}")


def pause_binary() -> Path:
    """Kubernetes' pause, compiled static from the pinned module's own source (as its Makefile does)."""
    source = module_dir(NODE_TOOLS[0], "k8s.io/kubernetes") / "build/pause/linux/pause.c"
    version = kubeadm_constant("PauseVersion")
    gcc = _run(["gcc", "--version"], "gcc --version").splitlines()[0]
    out = gotools.cache_root() / "kindnode" / f"pause-{version}-{_digest(source.read_text(), gcc)}"
    binary = out / "pause"
    if binary.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_suffix(".tmp")
    _run(["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{version}-dra-driver", "-o", str(tmp),
          str(source)], "compiling pause (needs gcc and libc6-dev)")
    _run(["strip", str(tmp)], "stripping pause")
    tmp.rename(binary)
    return out


# --- step 2: component images -----------------------------------------------------------------------

@dataclass(frozen=True)
class Component:
    """One container image baked into the node, under the names pods refer to it by."""

    key: str
    """Short name: the private cache tag's repository."""
    names: tuple[str, ...]
    files: dict[str, Path]
    """Path in the image -> file on this machine (mode 0755)."""
    entrypoint: tuple[str, ...]
    user: str = "0"
    cmd: tuple[str, ...] = ()
    debian: bool = False
    """On the Debian image with :data:`NET_PACKAGES` instead of a minimal rootfs."""
    file_caps: dict[str, int] = field(default_factory=dict)
    """Path in the image -> capability bit granted as a file capability (permitted + effective)."""
    symlinks: dict[str, str] = field(default_factory=dict)

    def cache_tag(self) -> str:
        recipe = (RECIPE, self.names, {k: str(v) for k, v in self.files.items()}, self.entrypoint, self.user,
                  self.cmd, self.debian, NET_PACKAGES if self.debian else (), self.file_caps, self.symlinks)
        return f"{NAME_PREFIX}/kind-images/{self.key}:{_digest(*recipe)}"


def components(bins: Binaries, version: str) -> list[Component]:
    etcd_tag = kubeadm_constant("DefaultEtcdVersion")
    coredns_tag = kubeadm_constant("CoreDNSVersion")
    pause_tag = kubeadm_constant("PauseVersion")
    busybox = prereqs.find_busybox()
    control_plane = [
        Component(name, (f"registry.k8s.io/{name}:{version}",), {f"/usr/local/bin/{name}": bins.kubernetes / name},
                  entrypoint=(f"/usr/local/bin/{name}",))
        for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")]
    helper_applets = {f"/bin/{applet}": "busybox" for applet in ("sh", "mkdir", "rm", "ls", "cat", "sleep")}
    return [
        *control_plane,
        Component("kube-proxy", (f"registry.k8s.io/kube-proxy:{version}",),
                  {"/usr/local/bin/kube-proxy": bins.node / "kube-proxy"}, entrypoint=("/usr/local/bin/kube-proxy",),
                  debian=True),
        Component("etcd", (f"registry.k8s.io/etcd:{etcd_tag}",), {"/usr/local/bin/etcd": bins.etcd / "etcd"},
                  entrypoint=("/usr/local/bin/etcd",)),
        # Upstream runs CoreDNS as nonroot with a file capability to bind port 53; kubeadm's
        # Deployment drops every capability but NET_BIND_SERVICE.
        Component("coredns", (f"registry.k8s.io/coredns/coredns:{coredns_tag}",), {"/coredns": bins.coredns / "coredns"},
                  entrypoint=("/coredns",), user=NONROOT, file_caps={"/coredns": CAP_NET_BIND_SERVICE}),
        # kubeadm lists pause:<PauseVersion>; kind's containerd config names pause:3.10 as the
        # sandbox image (images/base/files/etc/containerd/config.toml), so it answers to both.
        Component("pause", tuple(dict.fromkeys([f"registry.k8s.io/pause:{pause_tag}", sandbox_image()])),
                  {"/pause": bins.pause / "pause"}, entrypoint=("/pause",), user="65535:65535"),
        Component("kindnetd", (f"{NAME_PREFIX}/kind/kindnetd:{bins.kindnet.name.rsplit('-', 1)[1]}",),
                  {"/usr/local/bin/kindnetd": bins.kindnet / "kindnetd"}, entrypoint=("/usr/local/bin/kindnetd",),
                  debian=True),
        Component("local-path-provisioner",
                  (f"{NAME_PREFIX}/kind/local-path-provisioner:{gotools.TOOLS[LOCAL_PATH_TOOL].version()}",),
                  {"/usr/local/bin/local-path-provisioner": bins.local_path / "local-path-provisioner"},
                  entrypoint=("/usr/local/bin/local-path-provisioner",)),
        Component("local-path-helper", (f"{NAME_PREFIX}/kind/local-path-helper:busybox-{_file_digest(busybox)}",),
                  {"/bin/busybox": busybox}, entrypoint=(), cmd=("sh",), symlinks=helper_applets),
    ]


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def sandbox_image() -> str:
    config = kind_module() / "images/base/files/etc/containerd/config.toml"
    for line in config.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "sandbox_image":
            return value.strip().strip('"')
    raise KindNodeError(f"kindnode: no sandbox_image in {config}")


def file_capability(bit: int) -> bytes:
    """A ``security.capability`` xattr (VFS_CAP_REVISION_2, effective) granting one capability."""
    magic = 0x02000000 | 0x1  # revision 2 | VFS_CAP_FLAGS_EFFECTIVE
    permitted = (1 << bit) if bit < 32 else 0
    permitted_hi = (1 << (bit - 32)) if bit >= 32 else 0
    return b"".join(n.to_bytes(4, "little") for n in (magic, permitted, 0, permitted_hi, 0))


def _tar_add(tar: tarfile.TarFile, name: str, data: bytes = b"", mode: int = 0o644, kind: bytes = tarfile.REGTYPE,
             link: str = "", xattrs: dict[str, bytes] | None = None) -> None:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.type, info.mode, info.size, info.linkname, info.mtime = kind, mode, len(data), link, 0
    if xattrs:
        # PAX records are str; the kernel's capability bytes go through latin-1 unchanged (Go's
        # archive/tar, which Docker unpacks with, reads them back the same way).
        info.pax_headers = {f"SCHILY.xattr.{k}": v.decode("latin-1") for k, v in xattrs.items()}
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def minimal_rootfs(component: Component) -> bytes:
    """The image's whole filesystem: its binaries, users for root and nonroot, and a /tmp."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, encoding="latin-1") as tar:
        dirs = {"/etc", "/tmp", "/bin"} | {str(Path(p).parent) for p in (*component.files, *component.symlinks)}
        for directory in sorted(d for d in dirs if d != "/"):
            _tar_add(tar, directory, mode=0o1777 if directory == "/tmp" else 0o755, kind=tarfile.DIRTYPE)
        _tar_add(tar, "/etc/passwd", b"root:x:0:0:root:/root:/sbin/nologin\n"
                                     b"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")
        _tar_add(tar, "/etc/group", b"root:x:0:\nnonroot:x:65532:\n")
        for path, source in sorted(component.files.items()):
            caps = component.file_caps.get(path)
            _tar_add(tar, path, source.read_bytes(), mode=0o755,
                     xattrs={"security.capability": file_capability(caps)} if caps is not None else None)
        for path, target in sorted(component.symlinks.items()):
            _tar_add(tar, path, kind=tarfile.SYMTYPE, link=target, mode=0o777)
    return buf.getvalue()


def _changes(component: Component) -> list[str]:
    changes = [f"ENTRYPOINT {json.dumps(list(component.entrypoint))}", f"CMD {json.dumps(list(component.cmd))}",
               f"USER {component.user}", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    return [arg for change in changes for arg in ("--change", change)]


def ensure_component(component: Component) -> str:
    """The component's image in the daemon under its cache tag and its real names."""
    tag = component.cache_tag()
    if not docker.image_exists(tag):
        if component.debian:
            _commit_onto(docker.debian_image(NET_PACKAGES), component, tag)
        else:
            proc = subprocess.run([docker.DEBIAN_DOCKER, "import", *_changes(component), "-", tag],
                                  input=minimal_rootfs(component), env=docker.docker_env(), capture_output=True, check=False)
            if proc.returncode != 0:
                raise KindNodeError(f"kindnode: docker import {component.key} failed: {proc.stderr.decode()[-2000:]}")
    for name in component.names:
        _docker("tag", tag, name, what=f"tagging {name}")
    return tag


def _commit_onto(base: str, component: Component, tag: str) -> None:
    """The base image plus the component's files: a stopped container, ``docker cp``, ``docker commit``."""
    container = _docker("create", base, what=f"creating a container for {component.key}").strip()
    try:
        for path, source in component.files.items():
            _docker("cp", str(source), f"{container}:{path}", what=f"copying {source.name}")
        _docker("commit", *_changes(component), container, tag, what=f"committing {component.key}")
    finally:
        _docker("rm", "-f", container, what="removing the build container")


# --- step 3: kind's base image ----------------------------------------------------------------------

def kind_module() -> Path:
    return module_dir(KIND_TOOL, "sigs.k8s.io/kind")


def base_packages(dockerfile: str) -> list[str]:
    """The packages of the base Dockerfile's ``clean-install`` (one RUN, a package list per line)."""
    packages: list[str] = []
    collecting = False
    for raw in dockerfile.splitlines():
        line = raw.strip().rstrip("\\").strip()
        if "clean-install" in line and line.endswith("clean-install") and "DEBIAN_FRONTEND" in line:
            collecting = True
        elif collecting:
            if line.startswith("&&"):
                break
            packages += line.split()
    if not packages:
        raise KindNodeError("kindnode: found no clean-install package list in kind's images/base/Dockerfile")
    return packages


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def base_tag(bins: Binaries) -> str:
    recipe_dir = kind_module() / "images/base"
    key = _digest(RECIPE, docker.SUITE, docker.MIRROR, _tree_digest(recipe_dir), str(bins.runtime), str(bins.cni),
                  str(bins.crictl))
    return f"{NAME_PREFIX}/kind-base:{docker.SUITE}-{key}"


def ensure_base(bins: Binaries, timings: dict[str, float]) -> str:
    tag = base_tag(bins)
    if docker.image_exists(tag):
        return tag
    recipe_dir = kind_module() / "images/base"
    with tempfile.TemporaryDirectory(prefix="kind-base-", dir=_scratch()) as scratch:
        rootfs = Path(scratch) / "rootfs"
        with _timed("base: mmdebstrap", timings):
            # kind starts from debian-slim and removes docs, man pages, apt lists and logs (clean-install).
            docker.mmdebstrap(base_packages((recipe_dir / "Dockerfile").read_text()), rootfs, drop_logs=True)
        with _timed("base: files, binaries, systemd", timings):
            _install_kind_files(recipe_dir / "files", rootfs)
            _install_runtime(bins, rootfs)
            _systemd_tweaks(rootfs)
        with _timed("base: docker import", timings):
            # kind's: systemd checks `container`, and exits on SIGRTMIN+3 (SIGTERM re-executes it).
            _import_dir(rootfs, tag, ["ENV container=docker", 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]'],
                        stop_signal="SIGRTMIN+3")
    return tag


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One image build at a time per machine: two would race on the same tags."""
    path = gotools.cache_root() / "kindnode" / ".build.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _scratch() -> Path:
    path = gotools.cache_root() / "kindnode" / "scratch"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _copy(source: Path, target: Path, mode: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    target.chmod(mode)


def _install_kind_files(files: Path, rootfs: Path) -> None:
    """kind's COPY lines: scripts and /kind/bin 0755, everything else 0644."""
    for source in sorted(p for p in files.rglob("*") if p.is_file()):
        relative = source.relative_to(files)
        executable = relative.parts[:3] == ("usr", "local", "bin") or relative.parts[:2] == ("kind", "bin")
        _copy(source, rootfs / relative, 0o755 if executable else 0o644)
    for directory in ("kind", "kind/bin"):
        (rootfs / directory).chmod(0o755)


def _install_runtime(bins: Binaries, rootfs: Path) -> None:
    for name in ("containerd", "ctr", "containerd-shim-runc-v2"):
        _copy(bins.runtime / name, rootfs / "usr/local/bin" / name, 0o755)
    _copy(bins.runtime / "runc", rootfs / "usr/local/sbin/runc", 0o755)
    _copy(bins.crictl / "crictl", rootfs / "usr/local/bin/crictl", 0o755)
    for plugin in CNI_PLUGINS:
        _copy(bins.cni / plugin, rootfs / "opt/cni/bin" / plugin, 0o755)
    # kind: `ctr oci spec | jq` adding its product-files hook and dropping rlimits.
    spec = json.loads(_run([str(bins.runtime / "ctr"), "oci", "spec"], "ctr oci spec"))
    spec.setdefault("hooks", {}).setdefault("createContainer", []).append({"path": "/kind/bin/mount-product-files.sh"})
    spec.get("process", {}).pop("rlimits", None)
    (rootfs / "etc/containerd/cri-base.json").write_text(json.dumps(spec, indent=2) + "\n")
    (rootfs / "etc/kubernetes/manifests").mkdir(parents=True, exist_ok=True)


def _systemd_tweaks(rootfs: Path) -> None:
    """kind's: no unit other than its own starts, journald does not read kmsg, /sbin/init is systemd."""
    for pattern in ("lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service",
                    "lib/systemd/system/multi-user.target.wants/*", "etc/systemd/system/*.wants/*",
                    "lib/systemd/system/local-fs.target.wants/*", "lib/systemd/system/sockets.target.wants/*udev*",
                    "lib/systemd/system/sockets.target.wants/*initctl*", "lib/systemd/system/basic.target.wants/*"):
        for path in rootfs.glob(pattern):
            path.unlink()
    with (rootfs / "etc/systemd/journald.conf").open("a") as conf:
        conf.write("ReadKMsg=no\n")
    init = rootfs / "sbin/init"
    if not init.exists() and not init.is_symlink():
        init.symlink_to("/usr/lib/systemd/systemd")
    _run(["chroot", str(rootfs), "systemctl", "enable", "kubelet.service", "containerd.service",
          "undo-mount-hacks.service"], "systemctl enable (chroot)")
    _run(["chroot", str(rootfs), "systemctl", "mask", "systemd-binfmt.service"], "systemctl mask (chroot)")


def _import_dir(rootfs: Path, tag: str, changes: Sequence[str], stop_signal: str = "") -> None:
    imported = f"{tag}-import" if stop_signal else tag
    tar = subprocess.Popen(["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-C", str(rootfs), "-cf", "-", "."],
                           stdout=subprocess.PIPE)
    assert tar.stdout is not None
    args = [arg for change in changes for arg in ("--change", change)]
    try:
        proc = subprocess.run([docker.DEBIAN_DOCKER, "import", *args, "-", imported], stdin=tar.stdout,
                              env=docker.docker_env(), capture_output=True, check=False)
    finally:
        tar.stdout.close()  # so that tar gets SIGPIPE, not a full pipe, if docker stopped reading
        if tar.wait() != 0:
            proc = subprocess.CompletedProcess([], 1, b"", f"tar of {rootfs} failed".encode())
    if proc.returncode != 0:
        raise KindNodeError(f"kindnode: docker import {tag} failed: {proc.stderr.decode()[-2000:]}")
    if stop_signal:
        # Docker 20.10 takes no STOPSIGNAL in `import --change` nor `commit --change`; a one-line
        # build from the local image does (no layer, no registry: the classic builder).
        dockerfile = f"FROM {imported}\nSTOPSIGNAL {stop_signal}\n".encode()
        build = subprocess.run([docker.DEBIAN_DOCKER, "build", "-q", "-t", tag, "-"], input=dockerfile,
                               env={**docker.docker_env(), "DOCKER_BUILDKIT": "0"}, capture_output=True, check=False)
        if build.returncode != 0:
            raise KindNodeError(f"kindnode: setting STOPSIGNAL on {tag} failed: {build.stderr.decode()[-2000:]}")
        _docker("rmi", imported, what=f"untagging {imported}")


# --- step 4: the node image -------------------------------------------------------------------------

def manifests(comps: Sequence[Component]) -> dict[str, str]:
    """Our CNI and storage manifests, with the images they run filled in."""
    by_key = {c.key: c.names[0] for c in comps}
    values = {"@KINDNETD_IMAGE@": by_key["kindnetd"], "@LOCAL_PATH_PROVISIONER_IMAGE@": by_key["local-path-provisioner"],
              "@LOCAL_PATH_HELPER_IMAGE@": by_key["local-path-helper"]}
    out = {}
    for name in ("default-cni.yaml", "default-storage.yaml"):
        text = (MANIFESTS / name).read_text()
        for placeholder, value in values.items():
            text = text.replace(placeholder, value)
        out[name] = text
    return out


def node_tag(version: str, base: str, bins: Binaries, comps: Sequence[Component]) -> str:
    key = _digest(RECIPE, version, base, str(bins.kubernetes), str(bins.node), [c.cache_tag() for c in comps],
                  manifests(comps))
    return f"{NAME_PREFIX}/kind-node:{version}-{key}"


def _exec(container: str, *cmd: str, what: str) -> str:
    return _docker("exec", container, *cmd, what=what)


def build_node(tag: str, base: str, version: str, bins: Binaries, comps: Sequence[Component],
               timings: dict[str, float]) -> None:
    with _timed("node: component images", timings):
        for component in comps:
            ensure_component(component)
    container = _docker("run", "-d", "--privileged", "--security-opt", "seccomp=unconfined", "--entrypoint=sleep",
                        base, "infinity", what="starting the node build container").strip()
    try:
        with _timed("node: kubernetes binaries, manifests", timings):
            for name in ("kubeadm", "kubelet", "kubectl"):
                folder = bins.node if name == "kubeadm" else bins.kubernetes
                _docker("cp", str(folder / name), f"{container}:/usr/bin/{name}", what=f"copying {name}")
                _exec(container, "chown", "root:root", f"/usr/bin/{name}", what="chown")
            _write(container, "/kind/version", version)
            for name, text in manifests(comps).items():
                _write(container, f"/kind/manifests/{name}", text)
            _check_images(container, version, comps)
        with _timed("node: ctr images import", timings):
            _import_images(container, comps)
        with _timed("node: docker commit", timings):
            _docker("commit", "--change", 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]', container, tag,
                    what="committing the node image")
    finally:
        _docker("rm", "-f", "-v", container, what="removing the node build container")


def _write(container: str, path: str, text: str) -> None:
    proc = subprocess.run([docker.DEBIAN_DOCKER, "exec", "-i", container, "sh", "-c",
                           f'mkdir -p "$(dirname {path})" && cat > {path}'],
                          input=text.encode(), env=docker.docker_env(), capture_output=True, check=False)
    if proc.returncode != 0:
        raise KindNodeError(f"kindnode: writing {path} in the build container failed: {proc.stderr.decode()}")


def _check_images(container: str, version: str, comps: Sequence[Component]) -> None:
    """Every image ``kubeadm config images list`` names is one we built (kind would pull the rest)."""
    wanted = _exec(container, "kubeadm", "config", "images", "list", "--kubernetes-version", version,
                   what="kubeadm config images list").split()
    have = {name for c in comps for name in c.names}
    missing = [image for image in wanted if image not in have]
    if missing:
        raise KindNodeError(f"kindnode: kubeadm {version} needs images this recipe does not build: {', '.join(missing)}")


def _import_images(container: str, comps: Sequence[Component]) -> None:
    # kind's importer: containerd in the background, then `ctr images import` of each archive.
    _docker("exec", "-d", container, "containerd", what="starting containerd in the build container")
    deadline = time.monotonic() + 60
    while subprocess.run([docker.DEBIAN_DOCKER, "exec", container, "ctr", "info"], env=docker.docker_env(),
                         capture_output=True, check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise KindNodeError("kindnode: containerd in the build container did not answer within 60 s")
        time.sleep(0.5)
    for component in comps:
        save = subprocess.Popen([docker.DEBIAN_DOCKER, "save", *component.names], stdout=subprocess.PIPE,
                                env=docker.docker_env())
        proc = subprocess.run([docker.DEBIAN_DOCKER, "exec", "-i", container, "ctr", "--namespace=k8s.io", "images",
                               "import", "--label=io.cri-containerd.pinned=pinned", "--all-platforms",
                               "--no-unpack", "--digests", "-"],
                              stdin=save.stdout, env=docker.docker_env(), capture_output=True, check=False)
        save.wait()
        if proc.returncode != 0 or save.returncode != 0:
            raise KindNodeError(f"kindnode: importing {component.key} failed: {proc.stderr.decode()[-2000:]}")
    _exec(container, "sh", "-c", "pkill containerd; while pgrep -x containerd >/dev/null; do sleep 0.2; done",
          what="stopping containerd")


# --- the whole build ----------------------------------------------------------------------------------

@dataclass
class Result:
    image: str
    kind: Path
    timings: dict[str, float]


def build() -> Result:
    timings: dict[str, float] = {}
    started = time.monotonic()
    version = kubernetes_version()
    with _timed("go build kind", timings):
        kind = kind_binary()
    bins = ensure_binaries(timings)
    docker.up()
    comps = components(bins, version)
    base = base_tag(bins)
    tag = node_tag(version, base, bins, comps)
    if not docker.image_exists(tag):
        with _locked():
            if not docker.image_exists(tag):
                ensure_base(bins, timings)
                build_node(tag, base, version, bins, comps, timings)
    timings["total"] = round(time.monotonic() - started, 1)
    return Result(tag, kind, timings)


def image_sizes(tags: Sequence[str]) -> dict[str, int]:
    out = _docker("image", "inspect", "--format", "{{.Size}}", *tags, what="docker image inspect")
    return dict(zip(tags, (int(n) for n in out.split()), strict=True))


def tool_paths(result: Result) -> dict[str, str]:
    """What run-e2e.sh needs: the node image and the pinned kind, kubectl and helm."""
    return {"KIND_NODE_IMAGE": result.image, "KIND": str(result.kind),
            "KUBECTL": str(gotools.ensure(K8S_TOOLS, log=True) / "kubectl"),
            "HELM": str(gotools.ensure(["helm"], log=True) / "helm")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The kind node image, assembled offline from pinned builds.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_build = sub.add_parser("build", help="build (or find) the node image; print KIND_NODE_IMAGE= and KIND=")
    p_build.add_argument("--sizes", action="store_true", help="also print the size of every image (to stderr)")
    sub.add_parser("env", help="build (or find) everything; print export lines for a shell: eval \"$(...)\"")
    sub.add_parser("kind", help="build (or find) the pinned kind CLI and print its path")
    args = parser.parse_args(argv)
    # Build logs (gotools prints to stdout) go to stderr: stdout is for the lines a script reads.
    with contextlib.redirect_stdout(sys.stderr):
        if args.cmd == "kind":
            lines = [str(kind_binary())]
        else:
            result = build()
            _log("timings: " + json.dumps(result.timings))
            if args.cmd == "env":
                lines = [f"export {key}={value}" for key, value in tool_paths(result).items()]
            else:
                lines = [f"KIND_NODE_IMAGE={result.image}", f"KIND={result.kind}"]
            if getattr(args, "sizes", False):
                _print_sizes(result)
    print("\n".join(lines))
    return 0


def _print_sizes(result: Result) -> None:
    bins = ensure_binaries({})
    tags = [result.image, base_tag(bins), *[c.cache_tag() for c in components(bins, kubernetes_version())]]
    for tag, size in image_sizes(tags).items():
        _log(f"size {tag}: {size / 1e6:.0f} MB")


if __name__ == "__main__":
    sys.exit(main())
