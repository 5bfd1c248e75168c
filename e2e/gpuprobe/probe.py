"""The probe's part on the GPU machine: ``python3 e2e/gpuprobe/probe.py PROBE_DIR OUT_DIR``.

Each step records its result or its error in ``probe.json``; none stops the others:

* ``system``: nvidia-smi's own reading (``nvidia-smi.txt``), to check ours against;
* ``discover``: the NVML backend through the real pynvml (``gpus.json``, the dump format);
* ``describe``: the devices the plugin would publish, static and dynamic MIG (``devices.json``);
* ``health``: the NVML event set the health monitor waits on, one wait;
* ``toolkit``: the driver's edits from nvidia-ctk, for driver root ``/`` and ``/usr/local/nvidia``;
* per driver root, ``cdi_spec`` (the claim spec the plugin writes for GPU 0, the hook where the chart
  installs it, injected by the reference CDI library) and ``container`` (runc runs ``cudacheck``
  and nvidia-smi under that injection).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import Mock

ROOTS = ("/", "/usr/local/nvidia")
DRIVER = "gpu.dra-driver.io"
HOOK = Path(f"/var/lib/dra-driver/{DRIVER}/bin/nvidia-cdi-hook")
"""Where the chart installs the hook by default (``kubeletPlugin.cdiHook.installDir``): the specs
the probe records then name the path a node has, not the probe's folder."""
CONTAINER_SCRIPT = (
    "export PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin; "
    "ls /dev/nvidia*; env | grep -E '^(NVIDIA|DRA_)' | sort; /cudacheck; rc=$?; "
    "echo nvidia-smi: $(command -v nvidia-smi); nvidia-smi -L; exit $rc"
)


class Probe:
    def __init__(self, probe_dir: Path, out: Path) -> None:
        self.bin = probe_dir / "bin"
        self.rootfs = probe_dir / "rootfs"
        self.out = out
        self.steps: dict[str, dict[str, Any]] = {}
        self.gpus: list[Any] = []
        self.edits: dict[str, dict[str, Any]] = {}
        self.injected: dict[int, dict[str, Any]] = {}

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        started = time.monotonic()
        try:
            self.steps[name] = {"ok": True, "result": fn()}
        except Exception:
            self.steps[name] = {"ok": False, "error": traceback.format_exc()[-4000:]}
        self.steps[name]["seconds"] = round(time.monotonic() - started, 3)
        return self.steps[name].get("result")

    def system(self) -> str:
        commands = [
            "uname -a", "cat /proc/driver/nvidia/version", "nvidia-smi", "nvidia-smi -q",
            "nvidia-smi --query-gpu=name,pci.bus_id,memory.total,mig.mode.current,compute_cap,driver_version --format=csv",
            "nvidia-smi mig -lgip", "nvidia-smi mig -lgipp", "nvidia-smi topo -m",
        ]
        text = ""
        for cmd in commands:
            proc = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60)
            text += f"$ {cmd}\n[rc={proc.returncode}]\n{proc.stdout}{proc.stderr}\n"
        (self.out / "nvidia-smi.txt").write_text(text)
        return "nvidia-smi.txt"

    def discover(self) -> list[dict[str, Any]]:
        from dra_driver.node.discovery.dump import gpus_to_json
        from dra_driver.node.discovery.nvml import NvmlBackend

        nvml = NvmlBackend(sysfs_root=Path("/sys"))
        try:
            self.gpus = nvml.discover()
        finally:
            nvml.close()
        (self.out / "gpus.json").write_text(json.dumps(gpus_to_json(self.gpus, "nvml"), indent=2, sort_keys=True) + "\n")
        return [{"name": g.product_name, "memory": g.memory_bytes, "numa": g.pci.numa_node,
                 "mig": [g.mig_capable, g.mig_enabled], "profiles": [p.name for p in g.mig_profiles]} for g in self.gpus]

    def describe(self) -> dict[str, int]:
        from dra_driver.node.describe.devices import describe, enumerate_devices
        from dra_driver.node.publish.checker import check_device

        out = {}
        for dynamic in (False, True):
            devices, counters = describe(enumerate_devices(self.gpus, dynamic), DRIVER, dynamic)
            for device in devices:
                problems = check_device(device, DRIVER)
                assert not problems, [v.describe() for v in problems]
            out["dynamic" if dynamic else "static"] = {"devices": devices, "sharedCounters": counters}
        (self.out / "devices.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
        return {mode: len(v["devices"]) for mode, v in out.items()}

    def health(self) -> dict[str, Any]:
        import pynvml

        from dra_driver.node.publish.health import NvmlEventSource

        pynvml.nvmlInit()
        try:
            uuids = [g.uuid for g in self.gpus]
            supported = {u: hex(pynvml.nvmlDeviceGetSupportedEventTypes(pynvml.nvmlDeviceGetHandleByUUID(u)))
                         for u in uuids}
            monitor = Mock()
            source = NvmlEventSource(pynvml, uuids, monitor, wait_ms=1500)
            source.setup()
            started = time.monotonic()
            source.wait_once()
            return {"supported": supported, "registered": list(source.handles),
                    "waited_s": round(time.monotonic() - started, 2),
                    "reports": [str(c) for c in monitor.report.call_args_list], "lost": sorted(source.lost)}
        finally:
            pynvml.nvmlShutdown()

    def toolkit(self) -> dict[str, Any]:
        from dra_driver.node.prepare.toolkit import DriverEditsError, ToolkitConfig, generate

        HOOK.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.bin / "nvidia-cdi-hook", HOOK)
        tried: dict[str, Any] = {}
        for root in ROOTS:
            config = ToolkitConfig(ctk_path=self.bin / "nvidia-ctk", hook_path=HOOK,
                                   driver_root=Path(root), host_driver_root=Path(root), dev_root=Path("/"))
            try:
                self.edits[root] = generate(config)
            except DriverEditsError as exc:
                tried[root] = {"error": str(exc)}
                continue
            edits = self.edits[root]
            tried[root] = {"mounts": len(edits.get("mounts", [])), "hooks": len(edits.get("hooks", [])),
                           "env": edits.get("env", [])}
        return tried

    def cdi_spec(self, index: int, root: str) -> dict[str, Any]:
        from dra_driver.node.describe.devices import gpu_device_name
        from dra_driver.node.prepare.cdi import CdiSpecs
        from dra_driver.node.prepare.edits import ClaimDevice

        edits = self.edits[root]
        gpu = self.gpus[0]
        cdi_dir = Path(f"/tmp/gpuprobe-cdi-{index}")
        shutil.rmtree(cdi_dir, ignore_errors=True)
        specs = CdiSpecs(cdi_dir, DRIVER, node_name="gpu-probe", driver_edits=lambda: edits)
        claim = str(uuid.uuid4())
        ids = specs.write_claim_spec(claim, "default", "cuda-probe", [ClaimDevice(
            device_name=gpu_device_name(gpu), request="gpu", uuid=gpu.uuid, gpu_minor=gpu.minor)])
        shutil.copy(specs.spec_path(claim), self.out / f"claim-spec-{index}.json")
        proc = subprocess.run([str(self.bin / "cdi-validate"), "-inject", ",".join(ids), str(cdi_dir)],
                              capture_output=True, text=True, check=False)
        lines = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
        self.injected[index] = next(x for x in lines if "inject" in x)["oci"]
        return {"driver_root": root, "ids": ids, "validate_rc": proc.returncode,
                "lines": [{k: v for k, v in x.items() if k != "oci"} for x in lines], "stderr": proc.stderr[-2000:]}

    def container(self, index: int, oci: dict[str, Any]) -> dict[str, Any]:
        """A runc bundle as containerd builds one: its defaults, then the CDI injection merged in."""
        bundle = Path(f"/tmp/gpuprobe-bundle-{index}")
        shutil.rmtree(bundle, ignore_errors=True)
        bundle.mkdir()
        shutil.copytree(self.rootfs, bundle / "rootfs", symlinks=True)
        env = {**os.environ, "LD_LIBRARY_PATH": str(self.bin)}
        subprocess.run([str(self.bin / "runc"), "spec", "--bundle", str(bundle)], check=True, env=env)
        config = json.loads((bundle / "config.json").read_text())
        config["root"] = {"path": str(bundle / "rootfs"), "readonly": False}
        process = config["process"]
        process.update(terminal=False, args=["/bin/sh", "-c", CONTAINER_SCRIPT])
        process["env"] = process.get("env", []) + (oci.get("process") or {}).get("env", [])
        config["mounts"] = config.get("mounts", []) + (oci.get("mounts") or [])
        linux = oci.get("linux") or {}
        config["linux"]["devices"] = linux.get("devices") or []
        resources = config["linux"].setdefault("resources", {})
        resources["devices"] = (resources.get("devices") or []) + ((linux.get("resources") or {}).get("devices") or [])
        if oci.get("hooks"):
            config["hooks"] = oci["hooks"]
        (bundle / "config.json").write_text(json.dumps(config, indent=1))
        proc = subprocess.run([str(self.bin / "runc"), "--root", "/tmp/gpuprobe-runc", "run", "--bundle", str(bundle),
                               f"cuda-probe-{index}"], capture_output=True, text=True, env=env, timeout=180, check=False)
        return {"rc": proc.returncode, "stdout": proc.stdout[-6000:], "stderr": proc.stderr[-4000:]}

    def run(self) -> None:
        self.step("system", self.system)
        self.step("discover", self.discover)
        self.step("describe", self.describe)
        self.step("health", self.health)
        self.step("toolkit", self.toolkit)
        for index, root in enumerate(ROOTS):
            if root in self.edits:
                self.step(f"cdi_spec-{index}", lambda i=index, r=root: self.cdi_spec(i, r))  # type: ignore[misc]
            if index in self.injected:
                self.step(f"container-{index}", lambda i=index: self.container(i, self.injected[i]))  # type: ignore[misc]
        (self.out / "probe.json").write_text(json.dumps(self.steps, indent=1, sort_keys=True, default=str) + "\n")


def main(argv: list[str]) -> int:
    probe = Probe(Path(argv[1]).resolve(), Path(argv[2]))
    probe.run()
    print(json.dumps({name: {"ok": s["ok"], "s": s["seconds"]} for name, s in probe.steps.items()}))
    for name, s in probe.steps.items():
        if name.startswith("container"):
            print(name, json.dumps(s, indent=1)[:2500])
    return 0 if all(s["ok"] for s in probe.steps.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
