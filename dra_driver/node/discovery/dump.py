"""Dump discovered GPUs as JSON, and load such JSON back into model objects.

    python -m dra_driver.node.discovery.dump --backend nvml
    python -m dra_driver.node.discovery.dump --backend simulated --profile a100-mig --node-name node-1

The JSON of a real machine is kept as a test fixture; :func:`gpus_from_json` rebuilds the
``Gpu`` objects from it (strictly: unknown or missing keys are errors).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_driver.node.discovery.model import Gpu, MigDevice, MigPlacement, MigProfile, PciInfo

FORMAT_VERSION = 1


def gpus_to_json(gpus: Sequence[Gpu], backend: str = "") -> dict[str, Any]:
    return {"formatVersion": FORMAT_VERSION, "backend": backend, "gpus": [dataclasses.asdict(g) for g in gpus]}


def _build(cls: type[Any], data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object for {cls.__name__}, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)} for {cls.__name__}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{path}.{name}: missing")
            continue
        kwargs[name] = _value(hints[name], data[name], f"{path}.{name}")
    return cls(**kwargs)


def _value(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _value(inner[0], value, path)
    if origin is tuple:
        if not isinstance(value, list):
            raise ValueError(f"{path}: expected a list")
        return tuple(_value(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{path}: expected an object")
        return {str(k): str(v) for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path)  # type: ignore[arg-type]
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{path}: expected a boolean")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{path}: expected an integer")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{path}: expected a string")
        return value
    raise ValueError(f"{path}: unsupported type {hint!r}")


def gpus_from_json(data: Any) -> list[Gpu]:
    """Rebuild ``Gpu`` objects from :func:`gpus_to_json` output (or a bare list of GPU objects)."""
    items = data.get("gpus") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ValueError("expected {'gpus': [...]} or a list of GPUs")
    return [_build(Gpu, item, f"gpus[{i}]") for i, item in enumerate(items)]


def load_gpus(path: Path | str) -> list[Gpu]:
    return gpus_from_json(json.loads(Path(path).read_text()))


class FixtureBackend:
    """A read-only backend over GPUs loaded from a dump (for tests built on real-machine fixtures)."""

    name = "fixture"

    def __init__(self, gpus: Sequence[Gpu]) -> None:
        self._gpus = list(gpus)

    def discover(self) -> list[Gpu]:
        return list(self._gpus)

    def create_mig_instance(self, gpu: Gpu, profile: MigProfile, placement: MigPlacement) -> MigDevice:
        raise RuntimeError("the fixture backend cannot create MIG instances")

    def destroy_mig_instance(self, mig: MigDevice) -> None:
        raise RuntimeError("the fixture backend cannot destroy MIG instances")


__all__ = ["FixtureBackend", "PciInfo", "gpus_from_json", "gpus_to_json", "load_gpus"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra_driver.node.discovery.dump", description="Dump discovered GPUs as JSON.")
    parser.add_argument("--backend", choices=["nvml", "simulated"], default="nvml")
    parser.add_argument("--profile", default="h100-8x", help="simulated profile name or YAML path")
    parser.add_argument("--node-name", default="node-0", help="simulated: node name the UUIDs derive from")
    parser.add_argument("--sysfs-root", default="/sys", help="nvml: sysfs mount for NUMA/PCIe-root lookups")
    args = parser.parse_args(argv)
    try:
        if args.backend == "nvml":
            from dra_driver.node.discovery.nvml import NvmlBackend

            nvml = NvmlBackend(sysfs_root=Path(args.sysfs_root))
            try:
                gpus = nvml.discover()
            finally:
                nvml.close()
        else:
            from dra_driver.node.discovery.simulated import SimulatedBackend

            gpus = SimulatedBackend(args.profile, args.node_name).discover()
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    json.dump(gpus_to_json(gpus, args.backend), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
