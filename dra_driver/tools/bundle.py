"""``dra-driver debug-bundle``: one tar.gz with what a bug report about the driver needs.

The cluster's view: this driver's ResourceSlices, the DeviceClasses, every ResourceClaim with the
explanation ``dra-driver explain`` would print, the pods that use claims, the Events about all of
these (and the driver's own), the controller's leader Lease, and versions. With ``--node`` (or
``NODE_NAME`` set, as in the plugin's pod) it adds what only the node has: the checkpoint (with any
quarantined copies), this driver's CDI specs and a snapshot of the plugin's ``/metrics``.

Redacted before anything is written, in every object collected: container environment values (and
those values wherever else they turn up, a log line or a node file), containers' ``command`` and
``args``, the values of every annotation but the driver's own (``gpu.dra-driver.io/...``; the
``last-applied-configuration`` copy of the spec among them), managed fields, every field whose name
names a credential (:func:`credential_key`: ``token``, ``accessToken``, ``password``, ``clientSecret``,
``apiKey``, ``key``, ... in any case), and anything shaped like a bearer token or JWT anywhere in the
text.
Secrets are never read. What could not be collected (RBAC, an unreachable endpoint) is listed in
``manifest.json``; it does not stop the rest.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import re
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from dra_driver import CONFIG_API_GROUP, DEFAULT_DRIVER_NAME, __version__, apiprofile
from dra_driver.allocator.inventory import Inventory
from dra_driver.allocator.resolve import Engine
from dra_driver.allocator.rules import AUTO, SchedulerRules, choose_rules
from dra_driver.flags import env
from dra_driver.k8s.bodies import RawBody, RawDeviceClass, RawSlice
from dra_driver.k8s.client import (
    CLAIMS,
    DEVICE_CLASSES,
    EVENTS,
    LEASES,
    NODES,
    PODS,
    SLICES,
    ApiError,
    KubeApi,
    KubeconfigError,
    ListResult,
    RestKubeApi,
)
from dra_driver.k8s.objects import Obj, meta
from dra_driver.ondisk import (
    CDI_ROOT,
    CHECKPOINT_FILE,
    HEALTH_PORT,
    KUBELET_PLUGINS_DIR,
    METADATA_SUBDIR,
    claim_spec_prefix,
    metadata_spec_prefix,
)
from dra_driver.tools.explain.claim import build_report
from dra_driver.tools.terminal import one_line, printable

REDACTED = "<redacted>"
LEASE_NAME = "dra-driver-controller"
MAX_EXPLAINED_CLAIMS = 500
"""Claims explained one by one; beyond this the claims are still in the bundle, unexplained."""
MAX_NODE_FILE_BYTES = 16 << 20

_CREDENTIAL_WORDS = frozenset({"token", "password", "passwd", "passphrase", "secret", "credential", "credentials",
                                "key", "apikey", "auth", "authorization", "bearer", "cookie"})
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+")
# A ``key`` beside one of these is the Kubernetes field that names a key (a toleration's, a taint's,
# a selector requirement's, a secretKeyRef's, a projected item's), not a key itself.
_STRUCTURAL_KEY_SIBLINGS = frozenset({"operator", "effect", "values", "name", "path"})
_OUR_ANNOTATIONS = f"{CONFIG_API_GROUP}/"
_COMMAND_FIELDS = ("command", "args")
_TOKENS = (
    re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # a JWT (ServiceAccount tokens)
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
)
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


# --- redaction (pure) -------------------------------------------------------------------------


def redact_text(text: str) -> str:
    """Tokens anywhere in a string: JWTs and ``Bearer <token>`` (the word is kept, the value goes)."""
    text = _TOKENS[0].sub(REDACTED, text)
    return _TOKENS[1].sub(lambda m: m.group(1) + REDACTED, text)


def credential_key(name: str) -> bool:
    """Whether a field called ``name`` holds a credential: its last word (camelCase, ``-`` and ``_``
    split it) is one of :data:`_CREDENTIAL_WORDS`, in any case, or it ends in ``<such word>-data``
    (``client-key-data``). ``secretName`` or ``tokenFile`` only say where one is, and stay."""
    words = [w.lower() for w in _WORDS.findall(name)]
    if words and words[-1] == "data":
        words = words[:-1]
    return bool(words) and (words[-1] in _CREDENTIAL_WORDS or "".join(words) in _CREDENTIAL_WORDS)


def redact(value: Any) -> Any:
    """A deep copy with credentials, environment values, commands, foreign annotations and tokens
    replaced by ``<redacted>``."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = str(k)
            if key == "managedFields":
                continue
            if key == "env" and isinstance(v, list):
                out[k] = [_redact_env(e) for e in v]
            elif key == "annotations" and isinstance(v, Mapping):
                out[k] = {name: redact(note) if str(name).startswith(_OUR_ANNOTATIONS) else REDACTED
                          for name, note in v.items()}
            elif key in _COMMAND_FIELDS and isinstance(v, list):  # a container's, a probe's, a hook's
                out[k] = [REDACTED for _ in v]
            elif _holds_credential(key, v, value):
                out[k] = REDACTED
            else:
                out[k] = redact(v)
        return out
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def _holds_credential(key: str, value: Any, siblings: Mapping[str, Any]) -> bool:
    """A credential-named field with a value that could be one (flags and counts stay)."""
    if value is None or isinstance(value, bool | int | float) or not credential_key(key):
        return False
    return not (key == "key" and any(s in siblings for s in _STRUCTURAL_KEY_SIBLINGS))


def env_values(pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """The literal environment values of the pods' containers (of 4 characters or more: shorter
    ones are flags like ``1``, and replacing them everywhere would garble the bundle)."""
    out: set[str] = set()
    for pod in pods:
        spec = pod.get("spec")
        for kind in _CONTAINER_LISTS:
            for container in (spec.get(kind) or []) if isinstance(spec, Mapping) else []:
                for entry in container.get("env") or [] if isinstance(container, Mapping) else []:
                    value = entry.get("value") if isinstance(entry, Mapping) else None
                    if isinstance(value, str) and len(value) >= 4:
                        out.add(value)
    return out


def scrub(text: str, values: Iterable[str]) -> str:
    """Every occurrence of the values (also JSON-escaped) replaced: an environment value copied
    into an annotation or a log line must not survive either."""
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, REDACTED)
        escaped = json.dumps(value)[1:-1]
        if escaped != value:
            text = text.replace(escaped, REDACTED)
    return text


def _redact_env(entry: Any) -> Any:
    """A container's EnvVar keeps its name and where it comes from, never its value."""
    if not isinstance(entry, Mapping):
        return redact(entry)
    out = redact({k: v for k, v in entry.items() if k != "value"})
    if "value" in entry:
        out["value"] = REDACTED
    return out


# --- what belongs in the bundle (pure) --------------------------------------------------------


def ours(obj: Mapping[str, Any], driver: str) -> bool:
    """A ResourceSlice of this driver."""
    spec = obj.get("spec")
    return isinstance(spec, Mapping) and spec.get("driver") == driver


def uses_claims(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, Mapping) and bool(spec.get("resourceClaims"))


def driver_pod(pod: Mapping[str, Any]) -> bool:
    labels = meta(pod).get("labels") or {}
    return isinstance(labels, Mapping) and labels.get("app.kubernetes.io/name") == "dra-driver"


def related_events(events: Iterable[Obj], objects: Iterable[Mapping[str, Any]], nodes: Iterable[str]) -> list[Obj]:
    """Events about the collected objects or the nodes, and every Event this driver wrote."""
    uids = {str(meta(o).get("uid")) for o in objects if meta(o).get("uid")}
    names = {(str(o.get("kind", "")), str(meta(o).get("namespace") or ""), str(meta(o).get("name", "")))
             for o in objects}
    node_names = set(nodes)
    out = []
    for event in events:
        about = event.get("regarding") or {}
        if not isinstance(about, Mapping):
            continue
        key = (str(about.get("kind", "")), str(about.get("namespace") or ""), str(about.get("name", "")))
        if (str(event.get("reportingController", "")).startswith(f"{CONFIG_API_GROUP}/")
                or str(about.get("uid", "")) in uids or key in names
                or (key[0] == "Node" and key[2] in node_names)):
            out.append(event)
    return out


def node_summary(node: Mapping[str, Any]) -> Obj:
    """A Node's name, labels and versions; addresses and images stay out."""
    status = node.get("status") or {}
    return {"name": meta(node).get("name"), "labels": meta(node).get("labels") or {},
            "nodeInfo": status.get("nodeInfo") if isinstance(status, Mapping) else None}


# --- collecting -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSources:
    """Where a node's own state is read (the plugin's flags and environment name the same places)."""

    node: str
    state_dir: Path
    cdi_root: Path
    metrics_url: str


@dataclass
class Bundle:
    files: dict[str, bytes] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    secrets: set[str] = field(default_factory=set)
    """Values to remove from every file before anything is written (see :func:`scrub`)."""

    def scrubbed(self) -> dict[str, bytes]:
        return {name: scrub(data.decode(errors="replace"), self.secrets).encode() for name, data in self.files.items()}

    def add_json(self, name: str, doc: Any) -> None:
        self.files[name] = (json.dumps(redact(doc), indent=1, sort_keys=True, default=str) + "\n").encode()

    def listed(self, what: str, result: ListResult) -> list[RawBody]:
        """A list's items; each object that could not be decoded is a line in the manifest."""
        self.problems += [f"{what}: {bad.ref} (uid {bad.uid}) cannot be decoded and is left out: {bad.reason}"
                          for bad in result.undecodable]
        return result.items

    def attempt(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run one collection step; a failure becomes a line in the manifest."""
        try:
            return fn()
        except ApiError as exc:
            self.problems.append(f"{what}: {exc}")
        except (OSError, ValueError) as exc:
            self.problems.append(f"{what}: {exc}")
        return None


def collect_cluster(bundle: Bundle, api: KubeApi, driver: str, engine: Engine, nodes_of_interest: list[str],
                    rules: SchedulerRules | None = None) -> None:
    """``rules``: the scheduler version the explanations decide as (the newest the engine knows by default)."""
    slices = bundle.attempt("resourceslices", lambda: [
        s for s in bundle.listed("resourceslices", api.list(SLICES)) if ours(s, driver)])
    classes = bundle.attempt("deviceclasses", lambda: bundle.listed("deviceclasses", api.list(DEVICE_CLASSES)))
    claims = bundle.attempt("resourceclaims", lambda: bundle.listed("resourceclaims", api.list(CLAIMS)))
    all_pods = bundle.attempt("pods", lambda: bundle.listed("pods", api.list(PODS)))
    if all_pods is not None:
        bundle.secrets |= env_values(all_pods)
    pods = [p for p in all_pods if uses_claims(p) or driver_pod(p)] if all_pods is not None else None
    nodes = bundle.attempt("nodes", lambda: api.list(NODES).items)
    leases = bundle.attempt("leases", lambda: [x for x in api.list(LEASES).items if meta(x).get("name") == LEASE_NAME])
    events = bundle.attempt("events", lambda: api.list(EVENTS, cached=True).items)
    for name, doc in (("resourceslices", slices), ("deviceclasses", classes), ("resourceclaims", claims),
                      ("pods", pods), ("controller-leader-lease", leases)):
        if doc is not None:
            bundle.add_json(f"cluster/{name}.json", doc)
    if nodes is not None:
        bundle.add_json("cluster/nodes.json", [node_summary(n) for n in nodes])
    if claims is not None and slices is not None and classes is not None:
        bundle.add_json("cluster/explanations.json", explanations(claims, slices, classes, engine, driver, bundle, rules))
    if events is not None:
        collected = [*(slices or []), *(claims or []), *(pods or []), *(classes or [])]
        bundle.add_json("cluster/events.json", related_events(events, collected, nodes_of_interest))


def explanations(claims: list[RawBody], slices: list[RawSlice], classes: Sequence[RawDeviceClass], engine: Engine, driver: str,
                 bundle: Bundle, rules: SchedulerRules | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # One inventory for every claim; build_report takes it as a finished (or failed) future.
    inventory: Future[Inventory] = Future()
    try:
        inventory.set_result(engine.build_inventory(slices))
    except Exception as exc:  # last resort: handed on, each claim's report says the inventory failed
        inventory.set_exception(exc)
    for claim in claims[:MAX_EXPLAINED_CLAIMS]:
        m = meta(claim)
        key = f"{m.get('namespace')}/{m.get('name')}"
        try:
            out[key] = build_report(claim, slices, classes, claims, engine=engine, driver=driver, inventory=inventory,
                                    rules=rules)
        except Exception as exc:  # last resort: one claim the engine cannot handle must not lose the others
            out[key] = {"state": "error", "text": f"{type(exc).__name__}: {exc}"}
    if len(claims) > MAX_EXPLAINED_CLAIMS:
        bundle.problems.append(f"explanations: only the first {MAX_EXPLAINED_CLAIMS} of {len(claims)} claims explained")
    return out


def _add_files(bundle: Bundle, what: str, paths: list[Path], folder: str, *, redact: bool) -> None:
    """Each file (sorted) into ``folder`` of the bundle; one that cannot be read is a problem, not an end."""
    for path in sorted(paths):
        data = bundle.attempt(f"{what} {path}", partial(_read_small, path))
        if data is not None:
            bundle.files[f"{folder}/{path.name}"] = redact_text(data.decode(errors="replace")).encode() if redact else data


def collect_node(bundle: Bundle, src: NodeSources, driver: str,
                 fetch: Callable[[str], bytes] | None = None) -> None:
    base = f"node/{src.node}"
    if src.state_dir.is_dir():
        checkpoints = [p for p in src.state_dir.glob(f"{CHECKPOINT_FILE}*") if ".tmp-" not in p.name]
        _add_files(bundle, "checkpoint", checkpoints, f"{base}/state", redact=False)
    else:
        bundle.problems.append(f"checkpoint: {src.state_dir} is not a directory here (run this on the node, or "
                               "in its plugin pod, or pass --state-dir)")
    # Device metadata (KEP-5304): what each container was told about its devices, and the specs
    # that mount it.
    metadata_dir = src.state_dir / METADATA_SUBDIR
    if metadata_dir.is_dir():
        _add_files(bundle, "device metadata", list(metadata_dir.glob("*.json")), f"{base}/state/{METADATA_SUBDIR}",
                   redact=True)
    if src.cdi_root.is_dir():
        specs = [*src.cdi_root.glob(f"{claim_spec_prefix(driver)}*.json"),
                 *src.cdi_root.glob(f"{metadata_spec_prefix(driver)}*.json")]
        _add_files(bundle, "CDI spec", specs, f"{base}/cdi", redact=True)
    else:
        bundle.problems.append(f"CDI specs: {src.cdi_root} is not a directory here (pass --cdi-root)")
    body = bundle.attempt(f"plugin metrics {src.metrics_url}", lambda: (fetch or _http_get)(src.metrics_url))
    if body is not None:
        bundle.files[f"{base}/metrics.txt"] = body


def _read_small(path: Path) -> bytes:
    with open(path, "rb") as f:
        data = f.read(MAX_NODE_FILE_BYTES + 1)
    if len(data) > MAX_NODE_FILE_BYTES:
        raise ValueError(f"larger than {MAX_NODE_FILE_BYTES} bytes; not included")
    return data


def _http_get(url: str) -> bytes:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--metrics-url must be http(s), got {url!r}")
    with urllib.request.urlopen(url, timeout=5) as resp:
        data: bytes = resp.read(MAX_NODE_FILE_BYTES)
        return data


def manifest(bundle: Bundle, *, created: datetime, server_version: Any, node: str | None, driver: str) -> Obj:
    return {
        "kind": "DraDriverDebugBundle",
        "created": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "driver": driver,
        "versions": {"dra-driver": __version__, "python": platform.python_version(), "kubernetes": server_version},
        "node": node,
        "files": sorted(bundle.files),
        "notCollected": bundle.problems,
        "redacted": "container environment values, command and args, annotations but the driver's own, "
                    "managedFields, credential-named fields, bearer tokens and JWTs; Secrets are never read",
    }


def write_tar(bundle: Bundle, top: str, out: BinaryIO) -> None:
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in sorted(bundle.scrubbed().items()):
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            info.mode = 0o600
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))


def write_bundle(bundle: Bundle, top: str, output: str) -> str:
    """To ``output`` (``-`` = stdout) atomically, readable by the owner only; returns where."""
    if output == "-":
        buffer = io.BytesIO()
        write_tar(bundle, top, buffer)
        sys.stdout.buffer.write(buffer.getvalue())
        sys.stdout.buffer.flush()
        return "stdout"
    target = Path(output)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or Path("."))
    try:
        with os.fdopen(fd, "wb") as f:
            write_tar(bundle, top, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    except BaseException:  # not swallowed: the temporary file goes, the error is raised again
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return str(target)


# --- the command ------------------------------------------------------------------------------


def node_sources(node: str, state_dir: str | None, cdi_root: str | None, metrics_url: str | None,
                 driver: str) -> NodeSources:
    """The plugin's defaults (and its environment variables, set in its pod) unless given."""
    plugins_dir = Path(env("KUBELET_PLUGINS_DIR") or KUBELET_PLUGINS_DIR)
    port = env("HEALTH_PORT") or str(HEALTH_PORT)
    return NodeSources(
        node=node,
        state_dir=Path(state_dir or env("STATE_DIR") or plugins_dir / driver / apiprofile.for_driver(driver).state_subdir),
        cdi_root=Path(cdi_root or env("CDI_ROOT") or CDI_ROOT),
        metrics_url=metrics_url or f"http://127.0.0.1:{port}/metrics",
    )


def main(*, kubeconfig: str | None, output: str | None, node: str | None, state_dir: str | None = None,
         cdi_root: str | None = None, metrics_url: str | None = None, driver: str = DEFAULT_DRIVER_NAME,
         context: str | None = None, prog: str = "dra-driver debug-bundle") -> int:
    """Exit status 1, and no file, when nothing could be collected; ``prog``: how messages name the
    command (``kubectl dra debug-bundle``)."""
    created = datetime.now(UTC)
    top = f"dra-driver-debug-{created.strftime('%Y%m%dT%H%M%SZ')}"
    output = output or f"{top}.tar.gz"
    node = node or env("NODE_NAME")
    bundle = Bundle()
    server_version: Any = None
    api: RestKubeApi | None = None
    try:
        api = RestKubeApi.from_kubeconfig(kubeconfig, context, request_timeout=20.0,
                                          user_agent="dra-driver-debug-bundle")
    except KubeconfigError as exc:
        bundle.problems.append(f"cluster: {exc}")
    if api is not None:
        try:
            server_version = bundle.attempt("API server version", api.server_version)
            version = server_version.get("gitVersion") if isinstance(server_version, dict) else None
            rules, warning = choose_rules(AUTO, str(version) if version else None)
            if warning:
                bundle.problems.append(f"scheduler rules: {warning}")
            collect_cluster(bundle, api, driver, Engine(), [node] if node else [], rules)
        finally:
            api.close()
    if node:
        collect_node(bundle, node_sources(node, state_dir, cdi_root, metrics_url, driver), driver)
    if not bundle.files:
        print(f"{prog}: collected nothing, so wrote no bundle: {one_line('; '.join(bundle.problems))}", file=sys.stderr)
        return 1
    bundle.add_json("manifest.json", manifest(bundle, created=created, server_version=server_version, node=node,
                                              driver=driver))
    try:
        where = write_bundle(bundle, top, output)
    except OSError as exc:
        print(f"{prog}: cannot write {output}: {one_line(exc)}", file=sys.stderr)
        return 1
    print(f"{prog}: wrote {where} ({len(bundle.files)} files)", file=sys.stderr)
    for problem in bundle.problems:
        print(f"  not collected: {printable(problem)}", file=sys.stderr)
    return 0
