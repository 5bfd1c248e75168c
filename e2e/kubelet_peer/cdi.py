"""Container-runtime side of CDI: load and validate spec files, resolve qualified device names.

Validation follows what the CDI Go library (tags.cncf.io/container-device-interface v1.1.1, the
version containerd in the bed links) enforces when a runtime loads a spec directory (strict field
set, known versions, minimum version for the features used, name formats, container edits), so that
a spec this module accepts is one containerd accepts, and the other way round. The unit tests hold
it to that: each of their cases is also put to the library (unit_tests/e2e_tools/kubelet_peer/test_peer_cdi.py).
That library checks no annotation keys (its check takes a map[string]any and is handed a
map[string]string), so neither does this module.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KNOWN_VERSIONS: tuple[tuple[int, int, int], ...] = (
    (0, 1, 0),
    (0, 2, 0),
    (0, 3, 0),
    (0, 4, 0),
    (0, 5, 0),
    (0, 6, 0),
    (0, 7, 0),
    (0, 8, 0),
    (1, 0, 0),
    (1, 1, 0),
)
EARLIEST_LOADABLE = (0, 3, 0)

_VALID_HOOK_NAMES = frozenset({"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"})
_DEVICE_NODE_TYPES = frozenset({"", "b", "c", "u", "p"})
_KIND_PART_CHARS = re.compile(r"^[A-Za-z0-9_.\-]+$")
_DEVICE_NAME_CHARS = re.compile(r"^[A-Za-z0-9_.:\-]+$")


class CDIError(Exception):
    pass


class SpecError(CDIError):
    pass


# --- strict decoding --------------------------------------------------------------------------
# A field type is: str/int/bool, ("list", T), ("map", T) or a nested schema dict.
Schema = dict[str, Any]

_DEVICE_NODE: Schema = {
    "path": str,
    "hostPath": str,
    "type": str,
    "major": int,
    "minor": int,
    "fileMode": int,
    "permissions": str,
    "uid": int,
    "gid": int,
}
_MOUNT: Schema = {"hostPath": str, "containerPath": str, "options": ("list", str), "type": str}
_HOOK: Schema = {"hookName": str, "path": str, "args": ("list", str), "env": ("list", str), "timeout": int}
_INTEL_RDT: Schema = {
    "closID": str,
    "l3CacheSchema": str,
    "memBwSchema": str,
    "schemata": ("list", str),
    "enableMonitoring": bool,
}
_NET_DEVICE: Schema = {"hostInterfaceName": str, "name": str}
_EDITS: Schema = {
    "env": ("list", str),
    "deviceNodes": ("list", _DEVICE_NODE),
    "hooks": ("list", _HOOK),
    "mounts": ("list", _MOUNT),
    "intelRdt": _INTEL_RDT,
    "additionalGids": ("list", int),
    "netDevices": ("list", _NET_DEVICE),
}
_DEVICE: Schema = {"name": str, "annotations": ("map", str), "containerEdits": _EDITS}
_SPEC: Schema = {
    "cdiVersion": str,
    "kind": str,
    "annotations": ("map", str),
    "devices": ("list", _DEVICE),
    "containerEdits": _EDITS,
}


def _decode(value: Any, typ: Any, where: str) -> Any:
    """Type-check ``value`` against ``typ``; returns it without the fields set to null.

    The library reads JSON and YAML alike with a YAML decoder that knows its fields: a field name
    matches exactly (``CDIVersion`` is not ``cdiVersion``), an unknown one is refused, and null
    means "unset". All three are reproduced here.
    """
    if value is None:
        return None
    if isinstance(typ, dict):
        if not isinstance(value, dict):
            raise SpecError(f"{where}: expected an object, got {type(value).__name__}")
        out: dict[str, Any] = {}
        for key, v in value.items():
            if key not in typ:
                raise SpecError(f'{where}: unknown field "{key}"')
            decoded = _decode(v, typ[key], f"{where}.{key}")
            if decoded is not None:
                out[key] = decoded
        return out
    if isinstance(typ, tuple):
        kind, inner = typ
        if kind == "list":
            if not isinstance(value, list):
                raise SpecError(f"{where}: expected a list, got {type(value).__name__}")
            return [_decode(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        if not isinstance(value, dict):
            raise SpecError(f"{where}: expected a map, got {type(value).__name__}")
        return {str(k): _decode(v, inner, f"{where}[{k}]") for k, v in value.items()}
    if typ is bool:
        ok = isinstance(value, bool)
    elif typ is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, str)
    if not ok:
        raise SpecError(f"{where}: expected {typ.__name__}, got {type(value).__name__} {value!r}")
    return value


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise SpecError(f'duplicate field "{k}"')
        out[k] = v
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """The safe loader, refusing a key given twice in one mapping as the library's YAML decoder does."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[str, Any]:
    loader.flatten_mapping(node)
    return _reject_duplicate_keys(loader.construct_pairs(node, deep=True))


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def parse_document(text: str) -> Any:
    """JSON first, else YAML (the library reads both as YAML); a key given twice is refused either way."""
    try:
        return json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError:
        pass
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise SpecError(f"failed to parse: {e}") from e


# --- versions and names -----------------------------------------------------------------------


def parse_version(v: str) -> tuple[int, int, int] | None:
    m = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)", v.strip())
    if not m:
        return None
    ver = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    return ver if ver in KNOWN_VERSIONS else None


def fmt_version(v: tuple[int, int, int]) -> str:
    return ".".join(str(x) for x in v)


def _valid_kind_part(s: str) -> bool:
    return (
        bool(s) and s[0].isascii() and s[0].isalpha() and s[-1].isascii() and s[-1].isalnum() and bool(_KIND_PART_CHARS.match(s))
    )


def validate_kind(kind: str) -> tuple[str, str]:
    vendor, sep, cls = kind.partition("/")
    if not sep:
        raise SpecError(f'invalid kind "{kind}": expected vendor/class')
    if not _valid_kind_part(vendor):
        raise SpecError(f'invalid vendor name "{vendor}" in kind "{kind}"')
    if not _valid_kind_part(cls):
        raise SpecError(f'invalid class name "{cls}" in kind "{kind}"')
    return vendor, cls


def validate_device_name(name: str) -> None:
    if not name:
        raise SpecError("empty device name")
    if not (name[0].isascii() and name[0].isalnum() and name[-1].isascii() and name[-1].isalnum()):
        raise SpecError(f'invalid device name "{name}": must start and end with a letter or digit')
    if not _DEVICE_NAME_CHARS.match(name):
        raise SpecError(f'invalid device name "{name}": invalid character')


def parse_qualified_name(qualified: str) -> tuple[str, str]:
    """``vendor/class=name`` -> (kind, name); raises CDIError when malformed."""
    kind, sep, name = qualified.partition("=")
    if not sep or not kind or not name:
        raise CDIError(f'invalid CDI device name "{qualified}": expected vendor/class=name')
    try:
        validate_kind(kind)
        validate_device_name(name)
    except SpecError as e:
        raise CDIError(f'invalid CDI device name "{qualified}": {e}') from e
    return kind, name


def _validate_env(env: list[str], where: str) -> None:
    for e in env:
        if e.find("=") <= 0:
            raise SpecError(f'{where}: invalid environment variable "{e}"')


def validate_edits(edits: dict[str, Any], where: str) -> None:
    _validate_env(edits.get("env", []), f"{where}.env")
    for i, dn in enumerate(edits.get("deviceNodes", [])):
        w = f"{where}.deviceNodes[{i}]"
        if not dn.get("path"):
            raise SpecError(f"{w}: missing path")
        if dn.get("type", "") not in _DEVICE_NODE_TYPES:
            raise SpecError(f'{w}: invalid type "{dn["type"]}"')
        perms = dn.get("permissions", "")
        if perms != "none" and any(c not in "rwm" for c in perms):
            raise SpecError(f'{w}: invalid permissions "{perms}"')
    for i, h in enumerate(edits.get("hooks", [])):
        w = f"{where}.hooks[{i}]"
        if h.get("hookName") not in _VALID_HOOK_NAMES:
            raise SpecError(f'{w}: invalid hook name "{h.get("hookName", "")}"')
        if not h.get("path"):
            raise SpecError(f"{w}: missing path")
        _validate_env(h.get("env", []), f"{w}.env")
    for i, m in enumerate(edits.get("mounts", [])):
        w = f"{where}.mounts[{i}]"
        if not m.get("hostPath"):
            raise SpecError(f"{w}: missing hostPath")
        if not m.get("containerPath"):
            raise SpecError(f"{w}: missing containerPath")
    for i, g in enumerate(edits.get("additionalGids", [])):
        if g < 0 or g > 0xFFFFFFFF:
            raise SpecError(f"{where}.additionalGids[{i}]: out of range")
    rdt = edits.get("intelRdt")
    if rdt is not None:
        clos = rdt.get("closID", "")
        if clos != "/" and (len(clos) >= 4096 or clos in (".", "..") or "/" in clos or "\n" in clos):
            raise SpecError(f"{where}.intelRdt: invalid ClosID")
    seen_host: set[str] = set()
    seen_name: set[str] = set()
    for i, nd in enumerate(edits.get("netDevices", [])):
        w = f"{where}.netDevices[{i}]"
        host, name = nd.get("hostInterfaceName", ""), nd.get("name", "")
        if not host or not name:
            raise SpecError(f"{w}: hostInterfaceName and name are required")
        if host in seen_host or name in seen_name:
            raise SpecError(f"{w}: duplicate network device")
        seen_host.add(host)
        seen_name.add(name)


def _edits_empty(edits: dict[str, Any] | None) -> bool:
    return not edits or not any(edits.get(k) for k in _EDITS)


def minimum_required_version(spec: dict[str, Any]) -> tuple[int, int, int]:
    """Lowest cdiVersion that can express everything ``spec`` uses (CDI spec changelog)."""
    need = EARLIEST_LOADABLE
    devices = spec.get("devices", [])
    all_edits = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in devices]

    def bump(v: tuple[int, int, int]) -> None:
        nonlocal need
        need = max(need, v)

    for e in all_edits:
        if any(m.get("type") for m in e.get("mounts", [])):
            bump((0, 4, 0))
        if any(dn.get("hostPath") for dn in e.get("deviceNodes", [])):
            bump((0, 5, 0))
        if "intelRdt" in e:
            bump((0, 7, 0))
            rdt = e["intelRdt"]
            if rdt.get("schemata") or rdt.get("enableMonitoring"):
                bump((1, 1, 0))
        if e.get("additionalGids"):
            bump((0, 7, 0))
        if e.get("netDevices"):
            bump((1, 1, 0))
    if any(d.get("name", "")[:1].isdigit() for d in devices):
        bump((0, 5, 0))
    if spec.get("annotations") or any(d.get("annotations") for d in devices):
        bump((0, 6, 0))
    if "." in str(spec.get("kind", "")).partition("/")[2]:
        bump((0, 6, 0))
    return need


# --- specs and the registry -------------------------------------------------------------------


@dataclass
class Spec:
    path: str
    kind: str
    version: str
    edits: dict[str, Any]
    devices: dict[str, dict[str, Any]]


def validate_spec(raw: Any, path: str = "<spec>") -> Spec:
    if not isinstance(raw, dict):
        raise SpecError("spec is not an object")
    spec = _decode(raw, _SPEC, "spec")
    version_s = spec.get("cdiVersion", "")
    version = parse_version(version_s)
    if version is None:
        raise SpecError(f'invalid version "{version_s}"')
    if version < EARLIEST_LOADABLE:
        raise SpecError(f'unsupported version "{version_s}" (earliest loadable is {fmt_version(EARLIEST_LOADABLE)})')
    required = minimum_required_version(spec)
    if version < required:
        raise SpecError(f'the spec version must be at least v{fmt_version(required)} (has "{version_s}")')
    kind = spec.get("kind", "")
    validate_kind(kind)
    spec_edits = spec.get("containerEdits") or {}
    validate_edits(spec_edits, "spec.containerEdits")
    devices = spec.get("devices") or []
    if not devices:
        raise SpecError("invalid spec, no devices")
    by_name: dict[str, dict[str, Any]] = {}
    for i, d in enumerate(devices):
        name = d.get("name", "")
        validate_device_name(name)
        if name in by_name:
            raise SpecError(f'invalid spec, multiple device "{name}"')
        edits = d.get("containerEdits")
        if _edits_empty(edits):
            raise SpecError(f'device "{name}": empty container edits')
        validate_edits(edits or {}, f"devices[{i}].containerEdits")
        by_name[name] = edits or {}
    return Spec(path=path, kind=kind, version=version_s, edits=spec_edits, devices=by_name)


def load_spec_file(path: Path) -> Spec:
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"failed to read: {e}") from e
    return validate_spec(parse_document(text), str(path))


def _spec_files(cdi_dir: Path) -> list[Path]:
    try:
        entries = sorted(cdi_dir.iterdir())
    except FileNotFoundError:
        return []
    return [p for p in entries if p.suffix in (".json", ".yaml") and p.is_file()]


@dataclass
class ContainerEditsResult:
    """The merged effect of CDI edits on one container (what a runtime would put in the OCI spec)."""

    env: dict[str, str] = field(default_factory=dict)
    devices: list[dict[str, str]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    cdi_devices: list[str] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)

    def apply(self, edits: dict[str, Any]) -> None:
        # Later edits win for the same env name, device path or mount target, like the OCI
        # spec generator the CDI library uses.
        for e in edits.get("env", []):
            name, _, value = e.partition("=")
            self.env[name] = value
        for dn in edits.get("deviceNodes", []):
            entry = {"path": dn["path"], "hostPath": dn.get("hostPath") or dn["path"]}
            self.devices = [d for d in self.devices if d["path"] != entry["path"]] + [entry]
        for m in edits.get("mounts", []):
            mount: dict[str, Any] = {"hostPath": m["hostPath"], "containerPath": m["containerPath"]}
            if m.get("options"):
                mount["options"] = list(m["options"])
            if m.get("type"):
                mount["type"] = m["type"]
            self.mounts = [x for x in self.mounts if x["containerPath"] != mount["containerPath"]] + [mount]
        for h in edits.get("hooks", []):
            self.hooks.append({"hookName": h["hookName"], "path": h["path"]})

    def to_json(self) -> dict[str, Any]:
        return {
            "env": dict(self.env),
            "devices": list(self.devices),
            "mounts": list(self.mounts),
            "cdiDevices": list(self.cdi_devices),
        }


class Registry:
    """A snapshot of one CDI spec directory, as a runtime's CDI cache would see it."""

    def __init__(self, specs: list[Spec], errors: dict[str, list[str]], kinds_of_errors: dict[str, str]) -> None:
        self.errors = errors  # spec path -> problems
        self._error_kinds = kinds_of_errors  # spec path -> kind, when it could be read
        self.devices: dict[str, tuple[Spec, str]] = {}
        owners: dict[str, list[str]] = {}
        for spec in specs:
            for name in spec.devices:
                qualified = f"{spec.kind}={name}"
                owners.setdefault(qualified, []).append(spec.path)
                self.devices.setdefault(qualified, (spec, name))
        self.conflicts: dict[str, list[str]] = {q: paths for q, paths in owners.items() if len(paths) > 1}
        for q, paths in self.conflicts.items():
            # Equal priority (one directory): the device becomes unusable, each spec gets the error.
            del self.devices[q]
            for p in paths:
                others = [o for o in paths if o != p]
                self.errors.setdefault(p, []).append(f'conflicting device "{q}" (also in {", ".join(others)})')

    @classmethod
    def load(cls, cdi_dir: str | Path) -> Registry:
        specs: list[Spec] = []
        errors: dict[str, list[str]] = {}
        kinds: dict[str, str] = {}
        for path in _spec_files(Path(cdi_dir)):
            try:
                specs.append(load_spec_file(path))
            except SpecError as e:
                errors.setdefault(str(path), []).append(str(e))
                kinds[str(path)] = _guess_kind(path)
        return cls(specs, errors, kinds)

    def _related_errors(self, kind: str) -> list[str]:
        out = []
        for path, errs in sorted(self.errors.items()):
            k = self._error_kinds.get(path, "")
            # A spec whose kind cannot be trusted may be the one meant to define the device.
            if not k or k == kind or not _kind_is_valid(k) or any(f'"{kind}=' in e for e in errs):
                out.append(f"{os.path.basename(path)}: {'; '.join(errs)}")
        return out

    def resolve(self, ids: list[str], into: ContainerEditsResult | None = None) -> ContainerEditsResult:
        """Merge the edits of ``ids`` (spec edits before the first device of each spec) into ``into``."""
        result = into if into is not None else ContainerEditsResult()
        unresolved: list[str] = []
        problems: list[str] = []
        seen_specs: set[str] = set()
        for qualified in ids:
            try:
                kind, _ = parse_qualified_name(qualified)
            except CDIError as e:
                problems.append(str(e))
                continue
            found = self.devices.get(qualified)
            if found is None:
                unresolved.append(qualified)
                if qualified in self.conflicts:
                    problems.append(f'device "{qualified}" is defined in several specs: {self.conflicts[qualified]}')
                problems.extend(self._related_errors(kind))
                continue
            spec, name = found
            if spec.path not in seen_specs:
                seen_specs.add(spec.path)
                result.apply(spec.edits)
            result.apply(spec.devices[name])
            if qualified not in result.cdi_devices:
                result.cdi_devices.append(qualified)
        if unresolved or problems:
            msg = f"unresolvable CDI devices {', '.join(unresolved)}" if unresolved else "invalid CDI devices"
            uniq = list(dict.fromkeys(problems))
            if uniq:
                msg += " (" + "; ".join(uniq) + ")"
            raise CDIError(msg)
        return result


def _kind_is_valid(kind: str) -> bool:
    try:
        validate_kind(kind)
    except SpecError:
        return False
    return True


def _guess_kind(path: Path) -> str:
    try:
        raw = parse_document(path.read_text())
    except (OSError, SpecError):
        return ""
    kind = raw.get("kind") if isinstance(raw, dict) else None
    return kind if isinstance(kind, str) else ""
