"""Every Go tool the project builds, from a committed module: pinned, hermetic, cached by its pins.

Each tool has a folder ``e2e/tooling/gotools/<name>/`` holding a ``go.mod`` (the upstream module at
its pinned version, upstream's own ``replace`` directives, and ``tool`` lines naming the commands to
build) and the ``go.sum`` that pins every module in the build. Builds run with ``-mod=readonly``:
nothing is resolved at build time, nothing is tidied, and the module proxy can serve only what
``go.sum`` names. A stale or hand-edited pin fails in seconds with ``check``.

A tool can also be a C shared library whose main package is our own cgo source in that folder
(``mock-nvml``: ``libnvidia-ml.so.1`` over go-nvml's mock servers); its go.mod pins what the source
imports, and the source itself is part of the cache key.

The cache key of a build is a hash of its pins, its recipe (packages, tags, cgo, ldflags), the Go
version and the build features found on the machine (libseccomp's version for runc). A bumped pin
builds anew; an unchanged one never does. A caller may ask for some of a tool set's binaries only
(``ensure(..., only=...)``: the demo needs no kubelet); the folder and its key are the same, and a
later call asking for more builds only what is missing into it. A binary is built in a temporary
folder and renamed into place whole, so a failed or partial build never leaves a binary that looks
built.

Usage::

    python -m e2e.tooling.gotools pin kubernetes@v1.37.3   # re-pin one tool, print what changed
    python -m e2e.tooling.gotools pin --all                # regenerate every pin at its version
    python -m e2e.tooling.gotools check                    # go list -mod=readonly -deps, per tool
    python -m e2e.tooling.gotools build kubernetes etcd    # build (or find) and print the folder
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PINS = Path(__file__).resolve().parent / "gotools"
PIN_MODULE_PREFIX = "dra-driver.local/gotools/"


class ToolError(SystemExit):
    """A build or pin step failed; the message names the tool and what to do."""


def _k8s_ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.gitVersion={version}", f"-X {pkg}.gitMajor={major}", f"-X {pkg}.gitMinor={minor}",
                  f"-X {pkg}.gitTreeState=clean", f"-X {pkg}.buildDate=1970-01-01T00:00:00Z"]
    return " ".join(flags)


def _have(cmd: str) -> bool:
    return shutil.which(cmd) is not None


def _libseccomp_version() -> str:
    """The libseccomp that runc links against; a missing one stops the build with the package named."""
    missing = [pkg for cmd, pkg in (("gcc", "gcc"), ("pkg-config", "pkg-config")) if not _have(cmd)]
    proc = subprocess.run(["pkg-config", "--modversion", "libseccomp"], capture_output=True, text=True, check=False) \
        if _have("pkg-config") else None
    if proc is None or proc.returncode != 0:
        missing.append("libseccomp-dev")
    if missing:
        raise ToolError(
            f"gotools: runc needs {', '.join(missing)}: containerd gives every pod a seccomp profile, so a runc "
            f"built without libseccomp cannot run any pod. Install it: apt-get install {' '.join(missing)}")
    assert proc is not None
    return "libseccomp-" + proc.stdout.strip()


@dataclass(frozen=True)
class CLibrary:
    """A C shared library built (``-buildmode=c-shared``) from our own cgo source in the tool's folder,
    implementing a C API that a header of a pinned module declares.

    The header's folder is put on the include path, so the C compiler checks every exported function
    against NVIDIA's (or whoever's) own declarations. Functions the header declares that the source
    does not export are linked to ``not_implemented`` and kept out of the dynamic symbol table: a
    dependency's cgo wrappers may reference them, and a ``dlopen`` with ``RTLD_NOW`` must succeed.
    """

    soname: str
    header_module: str
    header: str
    """Path of the header inside ``header_module``."""
    not_implemented: str


@dataclass(frozen=True)
class Tool:
    name: str
    module: str
    # package -> binary name
    commands: dict[str, str]
    cgo: bool = False
    tags: str = ""
    ldflags: Callable[[str], str] = lambda _version: ""
    # Build features read off the machine; part of the cache key, and may refuse to build.
    features: Callable[[], str] = lambda: ""
    library: CLibrary | None = None
    own_source: bool = False
    """The main package is our own Go source in the folder (a command, not a library)."""
    toolchain: str = ""
    """The Go toolchain this tool alone builds, pins and checks with (``GOTOOLCHAIN``), when upstream's
    ``go`` line is newer than the machine's Go; the go command fetches it from the module proxy. Empty:
    the machine's Go, as every other tool."""
    replaces: tuple[str, ...] = ()
    """Our own ``replace`` lines, written after upstream's by every re-pin; each says why in TOOLS."""
    unserved_test_deps: tuple[str, ...] = ()
    """Modules the registry refuses that only the tests of dependencies import. A re-pin resolves
    those tests too; it tolerates errors about these modules, and only these, then proves with
    ``check`` that the commands build from the pin alone."""

    @property
    def ours(self) -> bool:
        return self.library is not None or self.own_source

    @property
    def folder(self) -> Path:
        return PINS / self.name

    def version(self) -> str:
        return pinned_version(self.folder / "go.mod", self.module)

    def sources(self) -> list[Path]:
        """Our own source in the folder (a library's or a command's), hashed into the cache key."""
        if not self.ours:
            return []
        return sorted(p for p in self.folder.iterdir() if p.is_file() and p.name not in ("go.mod", "go.sum"))


_K8S_COMMANDS = {f"k8s.io/kubernetes/cmd/{c}": c for c in
                 ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet")}
_K8S_SCHEDULER = {"k8s.io/kubernetes/cmd/kube-scheduler": "kube-scheduler"}

TOOLS: dict[str, Tool] = {t.name: t for t in (
    # The current minor, which the bed runs by default; and the oldest supported one, for the
    # smoke subset (e2e/tooling/binaries.py picks between them).
    Tool("kubernetes", "k8s.io/kubernetes", _K8S_COMMANDS, ldflags=_k8s_ldflags),
    Tool("kubernetes-1.36", "k8s.io/kubernetes", _K8S_COMMANDS, ldflags=_k8s_ldflags),
    # The next minor, before its release: its modules say `go 1.27.0`, newer than the machine's Go.
    # kube-scheduler alone, run beside the current control plane (DRA_TESTBED_SCHEDULER=1.38): the
    # registry does not serve every module the other commands need yet (docs/testbed.md, "Kubernetes
    # 1.38: what the registry serves"). The replace: the registry serves structured-merge-diff v7.0.0
    # but refuses the v7.0.1 that upstream requires; drop it once v7.0.1 is served.
    # k8s.io/ktesting (new in 1.38, refused too) is imported by client-go's and the scheduler's tests only.
    Tool("kubernetes-1.38", "k8s.io/kubernetes", _K8S_SCHEDULER, ldflags=_k8s_ldflags, toolchain="go1.27.3",
         replaces=("sigs.k8s.io/structured-merge-diff/v7 => sigs.k8s.io/structured-merge-diff/v7 v7.0.0",),
         unserved_test_deps=("k8s.io/ktesting",)),
    Tool("etcd", "go.etcd.io/etcd/server/v3", {"go.etcd.io/etcd/server/v3": "etcd"}),
    Tool("containerd", "github.com/containerd/containerd/v2",
         {f"github.com/containerd/containerd/v2/cmd/{c}": c for c in ("containerd", "ctr", "containerd-shim-runc-v2")},
         tags="no_btrfs no_devmapper no_zfs",
         ldflags=lambda v: f"-X github.com/containerd/containerd/v2/version.Version={v} "
                           "-X github.com/containerd/containerd/v2/version.Revision=testbed"),
    Tool("runc", "github.com/opencontainers/runc", {"github.com/opencontainers/runc": "runc"},
         cgo=True, tags="seccomp urfave_cli_no_docs", ldflags=lambda v: f"-X main.version={v.lstrip('v')}",
         features=lambda: _libseccomp_version()),  # looked up at call time: tests replace it
    Tool("cni-plugins", "github.com/containernetworking/plugins",
         {"github.com/containernetworking/plugins/plugins/main/loopback": "loopback",
          "github.com/containernetworking/plugins/plugins/main/bridge": "bridge",
          "github.com/containernetworking/plugins/plugins/ipam/host-local": "host-local",
          # kind's node image (e2e/testbed/kindnode.py): kindnet's conflist is ptp + portmap.
          "github.com/containernetworking/plugins/plugins/main/ptp": "ptp",
          "github.com/containernetworking/plugins/plugins/meta/portmap": "portmap"}),
    Tool("helm", "helm.sh/helm/v3", {"helm.sh/helm/v3/cmd/helm": "helm"},
         ldflags=lambda v: f"-X helm.sh/helm/v3/internal/version.version={v} "
                           "-X helm.sh/helm/v3/internal/version.gitTreeState=clean"),
    # The driver's CDI edits (libraries, binaries, hooks) for CUDA containers: dra_driver/node/prepare/toolkit.py.
    # cgo: nvidia-ctk loads libnvidia-ml through go-nvml's dlopen.
    Tool("nvidia-container-toolkit", "github.com/NVIDIA/nvidia-container-toolkit",
         {f"github.com/NVIDIA/nvidia-container-toolkit/cmd/{c}": c for c in ("nvidia-ctk", "nvidia-cdi-hook")},
         cgo=True, ldflags=lambda v: f"-X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version={v.lstrip('v')}"),
    # The unit suite's check of every CDI spec the driver writes: our command over the reference CDI
    # library, at the version containerd's pin links (e2e/testbed/cdicheck.py).
    Tool("cdi-validate", "tags.cncf.io/container-device-interface", {".": "cdi-validate"}, own_source=True),
    # NVML on CPU-only machines: our cgo shim over NVIDIA's mock DGX servers (e2e/testbed/mocknvml.py).
    Tool("mock-nvml", "github.com/NVIDIA/go-nvml", {".": "libnvidia-ml.so.1"}, cgo=True,
         library=CLibrary(soname="libnvidia-ml.so.1", header_module="github.com/NVIDIA/go-nvml",
                          header="pkg/nvml/nvml.h", not_implemented="draMockNvmlNotImplemented")),
    # The real-node benchmark's baseline: our own minimal driver on the upstream kubeletplugin helper,
    # pinned at the bed's Kubernetes (e2e/bench/realnode.py).
    Tool("baseline-driver", "k8s.io/dynamic-resource-allocation", {".": "baseline-driver"}, own_source=True),
    # --- the kind node image, assembled offline (e2e/testbed/kindnode.py) ---
    Tool("kind", "sigs.k8s.io/kind", {"sigs.k8s.io/kind": "kind"}),
    # kubeadm and kube-proxy at the `kubernetes` tool's version, in their own pins: adding them there
    # would change that tool's cache key (kubeadm needs modules the others do not). Same module
    # versions, so the shared Go build cache compiles only what is new. kindnode checks the versions agree.
    Tool("kubernetes-node", "k8s.io/kubernetes",
         {f"k8s.io/kubernetes/cmd/{c}": c for c in ("kubeadm", "kube-proxy")}, ldflags=_k8s_ldflags),
    # The etcd that kubeadm v1.37 deploys (constants.DefaultEtcdVersion 3.7.0-0); the bed's own etcd
    # stays at its pin.
    Tool("etcd-kind", "go.etcd.io/etcd/server/v3", {"go.etcd.io/etcd/server/v3": "etcd"}),
    Tool("cri-tools", "sigs.k8s.io/cri-tools", {"sigs.k8s.io/cri-tools/cmd/crictl": "crictl"},
         ldflags=lambda v: f"-X sigs.k8s.io/cri-tools/pkg/version.Version={v}"),
    # CoreDNS with only the plugins of kubeadm's default Corefile: our main package in the folder.
    Tool("coredns", "github.com/coredns/coredns", {".": "coredns"}, own_source=True),
    # kind's CNI: kindnetd's module is not served by the module proxy reachable here, so this is our
    # own small daemon doing what kind needs from it (conflist, routes to peers, masquerade).
    Tool("kindnet", "k8s.io/client-go", {".": "kindnetd"}, own_source=True),
    Tool("local-path-provisioner", "github.com/rancher/local-path-provisioner",
         {"github.com/rancher/local-path-provisioner": "local-path-provisioner"},
         ldflags=lambda v: f"-X main.VERSION={v}"),
    # The scale bench (e2e/bench/scale/): keeps thousands of Nodes Ready and runs their pods with
    # no kubelet. Its own client-go (one minor behind the bed) is inside the supported skew; the
    # version string is in its source, so no ldflags.
    Tool("kwok", "sigs.k8s.io/kwok", {"sigs.k8s.io/kwok/cmd/kwok": "kwok"}),
)}


def directive(gomod: str, keyword: str) -> list[str]:
    """The entries of one go.mod directive (``require``, ``replace``, ``tool``), single-line and block form."""
    entries: list[str] = []
    block = False
    for raw in gomod.splitlines():
        line = raw.split("//", 1)[0].strip()
        if block:
            if line == ")":
                block = False
            elif line:
                entries.append(line)
        elif line == f"{keyword} (":
            block = True
        elif line.startswith(f"{keyword} "):
            entries.append(line[len(keyword) + 1:].strip())
    return entries


def requirements(gomod: str) -> dict[str, str]:
    return {parts[0]: parts[1] for parts in (entry.split() for entry in directive(gomod, "require")) if len(parts) == 2}


def pinned_version(gomod: Path, module: str) -> str:
    version = requirements(gomod.read_text()).get(module)
    if not version:
        raise ToolError(f"gotools: {gomod} does not require {module}; re-pin it with `python -m e2e.tooling.gotools pin`")
    return version


def cache_root() -> Path:
    base = os.environ.get("DRA_TESTBED_CACHE") or os.environ.get("XDG_CACHE_HOME")
    root = Path(base) if base else Path.home() / ".cache"
    return root / "dra-driver" / "testbed"


def go_env(cgo: bool = False, mod: str = "readonly", toolchain: str = "") -> dict[str, str]:
    env = dict(os.environ)
    env["CGO_ENABLED"] = "1" if cgo else "0"
    env["GOFLAGS"] = f"-buildvcs=false -mod={mod}"
    env["GOWORK"] = "off"
    if toolchain:
        env["GOTOOLCHAIN"] = toolchain
    else:
        env.setdefault("GOTOOLCHAIN", "local")
    return env


def tool_env(tool: Tool, mod: str = "readonly") -> dict[str, str]:
    """The environment of every go command run for this tool: its cgo setting and its toolchain."""
    return go_env(cgo=tool.cgo, mod=mod, toolchain=tool.toolchain)


def _run(cmd: Sequence[str], cwd: Path, env: dict[str, str], what: str) -> str:
    nice = ["nice", "-n", "10"] if _have("nice") else []
    proc = subprocess.run([*nice, *cmd], cwd=cwd, env=env, text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        raise ToolError(f"gotools: {what} failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    return proc.stdout


def _require_go(names: Sequence[str]) -> None:
    if not _have("go"):
        raise ToolError(f"gotools: building {', '.join(names)} needs the Go toolchain (`make prereqs` says which version): https://go.dev/doc/install")


_go_version_memo: list[str] = []


def _go_version() -> str:
    if not _go_version_memo:
        _require_go(["the pinned Go tools"])
        _go_version_memo.append(_run(["go", "env", "GOVERSION"], PINS, go_env(), "go env").strip())
    return _go_version_memo[0]


def cache_key(names: Sequence[str]) -> str:
    """A hash of everything that decides the bytes of these tools' binaries."""
    h = hashlib.sha256(_go_version().encode())
    for name in sorted(names):
        tool = TOOLS[name]
        recipe = {"commands": tool.commands, "cgo": tool.cgo, "tags": tool.tags,
                  "ldflags": tool.ldflags(tool.version()), "features": tool.features(),
                  "library": dataclasses.asdict(tool.library) if tool.library else None}
        if tool.toolchain:  # only where set: the keys of every other tool's builds stay as they were
            recipe["toolchain"] = tool.toolchain
        h.update(json.dumps({name: recipe}, sort_keys=True).encode())
        for pin in ("go.mod", "go.sum"):
            h.update((tool.folder / pin).read_bytes())
        for source in tool.sources():
            h.update(source.name.encode() + b"\0" + source.read_bytes())
    return h.hexdigest()[:16]


def bin_dir(names: Sequence[str]) -> Path:
    """Where the binaries of these tools live once built (whether or not they are yet)."""
    label = "-".join(f"{n}-{TOOLS[n].version()}" for n in names)
    return cache_root() / "gotools" / f"{label}-{cache_key(names)}"


STAMP = ".complete"


def _wanted(names: Sequence[str], only: Collection[str] | None = None) -> dict[str, dict[str, str]]:
    """Per tool, the commands (package -> binary) to have built: every one, or those whose binary is in ``only``."""
    commands = {n: TOOLS[n].commands for n in names}
    if only is None:
        return commands
    known = {binary for cmds in commands.values() for binary in cmds.values()}
    unknown = sorted(set(only) - known)
    if unknown:
        raise ToolError(f"gotools: {', '.join(names)} build no {', '.join(unknown)}; they build: {', '.join(sorted(known))}")
    return {n: {pkg: binary for pkg, binary in cmds.items() if binary in only} for n, cmds in commands.items()}


def _missing(out: Path, commands: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The commands whose binary is not in the folder yet; a tool with none is left out."""
    missing = {n: {pkg: binary for pkg, binary in cmds.items() if not (out / binary).exists()}
               for n, cmds in commands.items()}
    return {n: cmds for n, cmds in missing.items() if cmds}


def _complete(out: Path, commands: dict[str, dict[str, str]]) -> bool:
    """The folder is ours (stamped) and holds every binary asked for: each one got there whole, by a rename."""
    return (out / STAMP).exists() and not _missing(out, commands)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


HEARTBEAT_S = 60.0
"""A line this often while one Go build runs: a cold Kubernetes build takes 10 minutes in silence."""


@contextlib.contextmanager
def _heartbeat(what: str, started: float, log: bool) -> Iterator[None]:
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            print(f"gotools: still {what} ({time.monotonic() - started:.0f}s)", flush=True)

    thread = threading.Thread(target=beat, name="gotools-heartbeat", daemon=True)
    if log:
        thread.start()
    try:
        yield
    finally:
        stop.set()


def _build_one(tool: Tool, commands: dict[str, str], out: Path, log: bool) -> None:
    """Build these commands of the tool (package -> binary) into ``out``."""
    version = tool.version()
    if log:
        print(f"gotools: building {tool.name} {version} ({', '.join(commands.values())})", flush=True)
    env = tool_env(tool)
    flags = ["-trimpath", "-ldflags", f"-s -w {tool.ldflags(version)}".strip()]
    if tool.tags:
        flags += ["-tags", tool.tags]
    started = time.monotonic()
    if tool.library is None and len(commands) > 1 and all(b == p.rsplit("/", 1)[-1] for p, b in commands.items()):
        # One go build for every command: while one binary links (one core), the other core compiles
        # the next one's packages, instead of idling through each link in turn.
        with _heartbeat(f"building {tool.name} {', '.join(commands.values())}", started, log):
            _run(["go", "build", *flags, "-o", f"{out}/", *commands], tool.folder, env, f"building {tool.name}")
    else:
        for package, binary in commands.items():
            with _heartbeat(f"building {tool.name} {binary}", started, log):
                if tool.library is not None:
                    _build_library(tool, tool.library, out, env)
                else:
                    _run(["go", "build", *flags, "-o", str(out / binary), package], tool.folder, env,
                         f"building {tool.name}")
    if log:
        print(f"gotools: built {tool.name} in {time.monotonic() - started:.0f}s", flush=True)


_EXPORT = re.compile(r"^//export\s+(\w+)\s*$", re.M)
_DECLARED = re.compile(r"\bDECLDIR\b[^;(]*?\b(\w+)\s*\(")


def ensure_command(ensure: Callable[[bool], Path], description: str, argv: list[str] | None = None) -> int:
    """``python -m`` entry of a tool set: build what is missing (``--print-dir``: quietly, then print the folder)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--print-dir", action="store_true", help="print the binary directory and exit")
    args = parser.parse_args(argv)
    out = ensure(not args.print_dir)
    if args.print_dir:
        print(out)
    return 0


def exported_functions(folder: Path) -> list[str]:
    """The C functions the cgo source of a folder exports (``//export NAME``)."""
    return sorted({name for path in folder.glob("*.go") for name in _EXPORT.findall(path.read_text())})


def declared_functions(header: str) -> list[str]:
    """The functions an NVML-style header declares (``... DECLDIR name(``)."""
    return sorted(set(_DECLARED.findall(header)))


def version_script(exports: Sequence[str]) -> str:
    """A linker version script that exports exactly these symbols."""
    return "{\n  global:\n" + "".join(f"    {name};\n" for name in exports) + "  local: *;\n};\n"


def not_implemented_script(declared: Sequence[str], exports: Sequence[str], target: str) -> str:
    """A linker script resolving every declared, unexported function to ``target`` where referenced."""
    done = set(exports)
    return "".join(f"PROVIDE({name} = {target});\n" for name in declared if name not in done)


def _build_library(tool: Tool, lib: CLibrary, out: Path, env: dict[str, str]) -> None:
    if not _have("gcc"):
        raise ToolError(f"gotools: {tool.name} is a cgo library and needs a C compiler; install it: apt-get install gcc")
    what = f"building {tool.name}"
    info = json.loads(_run(["go", "mod", "download", "-json", lib.header_module], tool.folder, env, what))
    header = Path(info["Dir"]) / lib.header
    exports = exported_functions(tool.folder)
    with tempfile.TemporaryDirectory(prefix="gotools-link-") as scratch:
        versions, stubs = Path(scratch) / "exports.map", Path(scratch) / "not-implemented.ld"
        versions.write_text(version_script(exports))
        stubs.write_text(not_implemented_script(declared_functions(header.read_text()), exports, lib.not_implemented))
        extld = f"-Wl,-soname,{lib.soname} -Wl,--version-script={versions} {stubs}"
        _run(["go", "build", "-buildmode=c-shared", "-trimpath", "-ldflags", f"-s -w -extldflags '{extld}'",
              "-o", str(out / lib.soname), "."],
             tool.folder, {**env, "CGO_CFLAGS": f"-O2 -I{header.parent}"}, what)
    for generated in out.glob("*.h"):  # the C header go writes beside the library: nothing uses it
        generated.unlink()


def ensure(names: Sequence[str], log: bool = True, only: Collection[str] | None = None) -> Path:
    """The folder holding the binaries of these tools (those named in ``only``, or every one), built
    from their pins if not yet cached. The folder is the same whichever binaries are asked for."""
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        raise ToolError(f"gotools: unknown tool(s) {', '.join(unknown)}; known: {', '.join(TOOLS)}")
    commands = _wanted(names, only)
    out = bin_dir(names)
    if _complete(out, commands):
        return out
    _require_go(names)
    with _locked(out.parent / f".{out.name}.lock"):
        if _complete(out, commands):
            return out
        started = time.monotonic()
        missing = _missing(out, commands)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            timings = {}
            for name, cmds in missing.items():
                t = time.monotonic()
                _build_one(TOOLS[name], cmds, tmp, log)
                timings[name] = round(time.monotonic() - t, 1)
            built = [binary for cmds in missing.values() for binary in cmds.values()]
            _install(tmp, out, built)
            _write_stamp(tmp, out, _stamp(names, out, timings))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if log:
            print(f"gotools: {', '.join(names)} ready in {out} after {time.monotonic() - started:.0f}s "
                  f"(built: {', '.join(built) or 'nothing new'})", flush=True)
    return out


def _stamp(names: Sequence[str], out: Path, timings: dict[str, float]) -> dict[str, object]:
    """What the folder's stamp records: the pins, and which of the tools' binaries the folder holds."""
    features = {n: TOOLS[n].features() for n in names}
    return {"tools": {n: TOOLS[n].version() for n in names}, "go": _go_version(),
            "toolchains": {n: TOOLS[n].toolchain for n in names if TOOLS[n].toolchain},
            "features": {n: f for n, f in features.items() if f},
            "binaries": [b for n in names for b in TOOLS[n].commands.values() if (out / b).exists()],
            "build_seconds": timings}


def _install(tmp: Path, out: Path, built: Sequence[str]) -> None:
    """Move freshly built binaries into the folder, one rename each: a crash leaves each one whole or absent."""
    out.mkdir(exist_ok=True)
    for binary in built:
        os.replace(tmp / binary, out / binary)


def _write_stamp(tmp: Path, out: Path, stamp: dict[str, object]) -> None:
    """(Re)write the folder's stamp by a rename, after its binaries: a stamp never stands beside a half one."""
    (tmp / STAMP).write_text(json.dumps(stamp, indent=2))
    os.replace(tmp / STAMP, out / STAMP)


def check(names: Sequence[str]) -> list[str]:
    """Problems with the pins: anything a readonly build would have to resolve beyond go.sum."""
    _require_go(names)
    problems = []
    for name in names:
        tool = TOOLS[name]
        proc = subprocess.run(["go", "list", "-deps", "-tags", tool.tags, *tool.commands], cwd=tool.folder,
                              env=tool_env(tool), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            problems.append(f"{name} ({tool.folder}): {proc.stderr.strip()[-2000:]}")
    return problems


# --- pinning: the only place where the module graph is resolved, by a person, before a commit ---

def _replaces(gomod: str) -> list[tuple[str, str]]:
    """(left, right) of every ``replace`` of a go.mod."""
    return [(left.strip(), right.strip()) for left, _, right in
            (entry.partition("=>") for entry in directive(gomod, "replace")) if right]


def upstream_replaces(gomod: str, version: str) -> list[str]:
    """Upstream's replaces as a dependent needs them: a go.mod's replaces apply only to its own builds.

    Local-directory replacements (Kubernetes' ``./staging/src/k8s.io/api``) point at the module's
    published twin: staging module ``k8s.io/X`` is released as ``v0.<minor>.<patch>`` alongside
    ``k8s.io/kubernetes v1.<minor>.<patch>``.
    """
    lines = []
    for left, right in _replaces(gomod):
        if re.match(r"\.{1,2}/", right):
            module = left.split()[0]
            if module.startswith("k8s.io/") and version.startswith("v1."):
                lines.append(f"{module} => {module} v0.{version.split('.', 1)[1]}")
            continue
        lines.append(f"{left} => {right}")
    return lines


def _go_errors(stderr: str) -> list[str]:
    """The error reports of a go command's stderr, each with its indented continuation lines."""
    reports: list[str] = []
    for line in stderr.splitlines():
        if line.startswith(("\t", " ")) and reports:
            reports[-1] += "\n" + line
        elif line.strip() and not re.match(r"go: (downloading|finding|found|upgraded|added) ", line):
            reports.append(line)
    return reports


def untolerated_tidy_errors(stderr: str, unserved_test_deps: Sequence[str]) -> list[str]:
    """Errors of ``go mod tidy -e`` other than a test of a dependency importing one of these modules."""
    def tolerated(report: str) -> bool:
        return " tested by\n" in report and any(
            re.search(rf"^\s+{re.escape(module)}(/\S*)?: {re.escape(module)}@", report, re.M)
            for module in unserved_test_deps)
    return [report for report in _go_errors(stderr) if not tolerated(report)]


def _tidy(tool: Tool) -> None:
    what = f"pinning {tool.name}"
    if not tool.unserved_test_deps:
        _run(["go", "mod", "tidy"], tool.folder, tool_env(tool, mod="mod"), what)
        return
    proc = subprocess.run(["go", "mod", "tidy", "-e"], cwd=tool.folder, env=tool_env(tool, mod="mod"),
                          text=True, capture_output=True, check=False)
    errors = untolerated_tidy_errors(proc.stderr, tool.unserved_test_deps)
    if proc.returncode != 0 or errors:
        raise ToolError(f"gotools: {what} failed ({proc.returncode}): go mod tidy -e\n" + "\n".join(errors)[-4000:])
    problems = check([tool.name])
    if problems:
        raise ToolError(f"gotools: {what}: the pin does not build without {', '.join(tool.unserved_test_deps)}: "
                        + "; ".join(problems))


def download_error(stdout: str, stderr: str) -> str:
    """Why ``go mod download -json`` failed: it reports a module's error in its JSON, on stdout."""
    with contextlib.suppress(ValueError):
        error = json.loads(stdout).get("Error")
        if error:
            return str(error)
    return stderr.strip()[-4000:] or stdout.strip()[-4000:]


def _download(spec: str, env: dict[str, str]) -> dict[str, str]:
    with tempfile.TemporaryDirectory() as scratch:
        proc = subprocess.run(["go", "mod", "download", "-json", spec], cwd=scratch, env=env, text=True,
                              capture_output=True, check=False)
    if proc.returncode != 0:
        raise ToolError(f"gotools: the module proxy does not serve {spec} (not released yet, or refused): "
                        f"{download_error(proc.stdout, proc.stderr)}")
    info: dict[str, str] = json.loads(proc.stdout)
    return info


def pin(name: str, version: str | None = None) -> list[str]:
    """Rewrite a tool's go.mod and go.sum at ``version`` (default: the pinned one); returns what changed."""
    tool = TOOLS[name]
    _require_go([name])
    folder = tool.folder
    folder.mkdir(parents=True, exist_ok=True)
    old = (folder / "go.mod").read_text() if (folder / "go.mod").exists() else ""
    version = version or (tool.version() if old else None)
    if not version:
        raise ToolError(f"gotools: {name} has no pin yet; say which version: pin {name}@vX.Y.Z")
    upstream = Path(_download(f"{tool.module}@{version}", go_env(mod="mod", toolchain=tool.toolchain))["GoMod"]).read_text()
    # Our own source (a library) needs the Go it is written for; a pinned upstream command, upstream's.
    go_line = re.search(r"^go\s+(\S+)", old if tool.ours and old else upstream, re.M)
    lines = [f"// Pinned build of {tool.module}; regenerate with: python -m e2e.tooling.gotools pin {name}@<version>",
             f"module {PIN_MODULE_PREFIX}{name}", "", f"go {go_line.group(1) if go_line else '1.25'}", "",
             f"require {tool.module} {version}", ""]
    replaces = upstream_replaces(upstream, version) + list(tool.replaces)
    if replaces:
        lines += ["replace (", *[f"\t{r}" for r in replaces], ")", ""]
    if not tool.ours:
        lines += ["tool (", *[f"\t{pkg}" for pkg in tool.commands], ")"]
    (folder / "go.mod").write_text("\n".join(lines) + "\n")
    (folder / "go.sum").unlink(missing_ok=True)
    _tidy(tool)
    before, after = requirements(old), requirements((folder / "go.mod").read_text())
    changes = [f"{m}: {before.get(m, '(new)')} -> {after.get(m, '(removed)')}"
               for m in sorted(set(before) | set(after)) if before.get(m) != after.get(m)]
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Pinned, hermetic builds of the project's Go tools.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_pin = sub.add_parser("pin", help="re-pin tools (NAME or NAME@VERSION), printing what changed")
    p_pin.add_argument("tools", nargs="*")
    p_pin.add_argument("--all", action="store_true")
    p_check = sub.add_parser("check", help="fail if a readonly build would resolve anything not in go.sum")
    p_check.add_argument("tools", nargs="*")
    p_build = sub.add_parser("build", help="build (or find cached) and print the binary folder")
    p_build.add_argument("tools", nargs="+")
    sub.add_parser("list", help="the tools and their pinned versions")
    args = parser.parse_args(argv)
    if args.cmd == "pin":
        specs = list(TOOLS) if args.all else args.tools
        if not specs:
            parser.error("pin: name tools (NAME or NAME@VERSION) or --all")
        for spec in specs:
            name, _, version = spec.partition("@")
            if name not in TOOLS:
                parser.error(f"pin: unknown tool {name!r}; known: {', '.join(TOOLS)}")
            changes = pin(name, version or None)
            print(f"{name}: {TOOLS[name].version()}: " + (f"{len(changes)} requirement(s) changed" if changes else "unchanged"))
            for change in changes:
                print(f"  {change}")
    elif args.cmd == "check":
        names = args.tools or list(TOOLS)
        problems = check(names)
        for problem in problems:
            print(f"gotools: pin check failed: {problem}", file=sys.stderr)
        if problems:
            return 1
        print(f"gotools: pins resolve from go.sum alone: {', '.join(names)}")
    elif args.cmd == "build":
        print(ensure(args.tools, log=True))
    else:
        for tool in TOOLS.values():
            print(f"{tool.name}\t{tool.module}\t{tool.version()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
