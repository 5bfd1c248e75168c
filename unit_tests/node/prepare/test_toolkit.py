"""The driver's CDI edits from the real nvidia-ctk (the pinned NVIDIA Container Toolkit) on a fake driver
root (e2e/testbed/fakedriver.py): extraction, host-path translation, caching, a missing driver, and
prepare putting them in every claim's spec or failing the claim."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from nodefix import DRIVER, NODE, Env, make_claim

from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.toolkit import (
    DriverEdits,
    DriverEditsError,
    ToolkitConfig,
    common_edits,
    generate,
    merge_edits,
)
from e2e.testbed import fakedriver

LIB = "/usr/lib/x86_64-linux-gnu"
VERSION = fakedriver.VERSION
HOOK = Path("/opt/dra/nvidia-cdi-hook")


@pytest.fixture(scope="module")
def ctk() -> Path:
    return fakedriver.toolkit_bin(log=False) / "nvidia-ctk"


def driver_root(tmp: Path, libcuda: bool = True) -> Path:
    root = fakedriver.make_driver_root(tmp / "driver", libcuda=libcuda, log=False)
    fakedriver.make_device_nodes(root, 2)
    return root


def config(ctk: Path, root: Path, host_root: Path | None = None) -> ToolkitConfig:
    return ToolkitConfig(ctk_path=ctk, hook_path=HOOK, driver_root=root, host_driver_root=host_root or root,
                         dev_root=root)


def mounts(edits: dict[str, Any]) -> dict[str, str]:
    return {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}


def hook_commands(edits: dict[str, Any]) -> dict[str, list[str]]:
    return {h["args"][1]: h["args"] for h in edits["hooks"]}


def test_common_edits_drop_device_nodes_and_visible_devices() -> None:
    spec = {"containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib"],
                               "deviceNodes": [{"path": "/dev/nvidia0"}],
                               "mounts": [{"hostPath": "/a", "containerPath": "/a"}]}}
    assert common_edits(spec) == {"env": ["NVIDIA_CTK_LIBCUDA_DIR=/usr/lib"],
                                  "mounts": [{"hostPath": "/a", "containerPath": "/a"}]}
    with pytest.raises(DriverEditsError, match="no mounts"):
        common_edits({"containerEdits": {"env": ["X=1"]}})


def test_merge_edits_appends_lists_without_duplicates() -> None:
    base = {"env": ["A=1"], "deviceNodes": [{"path": "/dev/nvidiactl"}]}
    merged = merge_edits(base, {"env": ["A=1", "B=2"], "mounts": [{"containerPath": "/x"}]})
    assert merged == {"env": ["A=1", "B=2"], "deviceNodes": [{"path": "/dev/nvidiactl"}],
                      "mounts": [{"containerPath": "/x"}]}
    assert base == {"env": ["A=1"], "deviceNodes": [{"path": "/dev/nvidiactl"}]}, "base is not changed"


def test_real_toolkit_edits_mount_the_driver_and_run_the_hooks(ctk: Path, tmp_path: Path) -> None:
    root = driver_root(tmp_path)
    edits = generate(config(ctk, root))
    got = mounts(edits)
    assert VERSION.startswith("570.")
    # Every file of the fake 570 install, each where a real one's is mounted (see fakedriver.py).
    for name in ("libnvidia-ml", *fakedriver.LIBRARIES):
        path = f"{LIB}/{name}.so.{VERSION}"
        assert got[path] == str(root / path.lstrip("/")), name
    for name in fakedriver.BINARIES:
        assert got[f"/usr/bin/{name}"] == str(root / "usr/bin" / name)
    for name in fakedriver.FIRMWARE:
        path = f"/lib/firmware/nvidia/{VERSION}/{name}"
        assert got[path] == str(root / path.lstrip("/"))
    socket = next(m for m in edits["mounts"] if m["containerPath"] == "/run/nvidia-persistenced/socket")
    assert socket["hostPath"] == str(root / fakedriver.PERSISTENCED_SOCKET) and "noexec" in socket["options"]
    assert not any(".so.1" in path or path.endswith(".so") for path in got), "links are the hooks' to make"
    hooks = hook_commands(edits)
    assert {h["path"] for h in edits["hooks"]} == {str(HOOK)}
    assert f"libcuda.so.1::{LIB}/libcuda.so" in hooks["create-symlinks"]
    assert hooks["update-ldcache"][-2:] == ["--folder", LIB]
    assert "deviceNodes" not in edits, "each claim brings only its own device nodes"
    assert not any(e.startswith("NVIDIA_VISIBLE_DEVICES=") for e in edits.get("env", []))


def test_host_paths_when_the_driver_root_is_mounted_in_the_plugins_container(ctk: Path, tmp_path: Path) -> None:
    root = driver_root(tmp_path)  # what the container sees at /driver-root
    edits = generate(config(ctk, root, host_root=Path("/run/nvidia/driver")))
    got = mounts(edits)
    assert got[f"{LIB}/libcuda.so.{VERSION}"] == f"/run/nvidia/driver{LIB}/libcuda.so.{VERSION}"
    assert got["/usr/bin/nvidia-smi"] == "/run/nvidia/driver/usr/bin/nvidia-smi"
    assert not any(str(root) in m["hostPath"] for m in edits["mounts"]), "no path of the plugin's own view is left"


def test_a_driver_without_libcuda_is_named_with_the_search_path(ctk: Path, tmp_path: Path) -> None:
    root = driver_root(tmp_path, libcuda=False)
    with pytest.raises(DriverEditsError) as err:
        generate(config(ctk, root))
    message = str(err.value)
    assert f"found no libcuda.so.{VERSION}" in message
    assert f"driver root {root}" in message and str(root / LIB.lstrip("/")) in message


def test_a_driver_root_without_a_driver_is_named_with_the_toolkits_error(ctk: Path, tmp_path: Path) -> None:
    root = tmp_path / "empty"
    fakedriver.make_device_nodes(root, 1)
    with pytest.raises(DriverEditsError) as err:
        generate(config(ctk, root))
    message = str(err.value)
    assert message.startswith(f"the NVIDIA driver was not found under driver root {root}: nvidia-ctk: ")
    assert str(root / "etc/ld.so.cache") in message


def test_a_missing_toolkit_is_named(tmp_path: Path) -> None:
    with pytest.raises(DriverEditsError, match="cannot run nvidia-ctk at /nonexistent/nvidia-ctk"):
        generate(config(Path("/nonexistent/nvidia-ctk"), tmp_path))


def test_edits_are_cached_and_regenerated_when_the_driver_changes(ctk: Path, tmp_path: Path) -> None:
    root = driver_root(tmp_path, libcuda=False)
    seen: list[str | None] = []
    cache = DriverEdits(config(ctk, root), on_change=lambda _edits, error: seen.append(error))
    with pytest.raises(DriverEditsError, match="libcuda"):
        cache.edits()
    with pytest.raises(DriverEditsError, match="libcuda"):
        cache.edits()
    assert cache.generations == 1, "a driver that did not change is not looked at again"
    fakedriver.make_driver_root(root, log=False)  # the driver gets installed
    first = cache.edits()
    assert cache.generations == 2 and f"{LIB}/libcuda.so.{VERSION}" in mounts(first)
    assert cache.edits() is first and cache.generations == 2
    lib = root / LIB.lstrip("/") / f"libcuda.so.{VERSION}"
    later = time.time() + 5
    os.utime(lib, (later, later))
    lib.write_bytes(b"new driver")
    cache.edits()
    assert cache.generations == 3
    assert len(seen) == 3 and seen[0] is not None and seen[1:] == [None, None]


class ToolkitEnv(Env):
    def __init__(self, tmp_path: Path, edits: DriverEdits) -> None:
        self.edits_cache = edits
        super().__init__(tmp_path)

    def new_cdi(self) -> CdiSpecs:
        return CdiSpecs(self.cdi_root, DRIVER, self.tmp / "devroot", node_name=NODE, driver_edits=self.edits_cache.edits)


def test_prepare_puts_the_driver_in_every_claims_spec(ctk: Path, tmp_path: Path) -> None:
    root = driver_root(tmp_path)
    env = ToolkitEnv(tmp_path, DriverEdits(config(ctk, root)))
    out = env.prepare_one(make_claim("a", [("gpu", "gpu-0")]))
    assert out.error is None, out.error
    uid = next(iter(env.checkpoint()))
    spec = env.spec(uid)
    edits = spec["containerEdits"]
    assert f"{LIB}/libcuda.so.{VERSION}" in mounts(edits)
    assert {h["args"][1] for h in edits["hooks"]} >= {"create-symlinks", "update-ldcache"}
    visible = [e for e in edits["env"] if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
    assert len(visible) == 1 and visible[0] != "NVIDIA_VISIBLE_DEVICES=void"
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def test_prepare_fails_per_claim_and_writes_no_spec_without_the_driver(ctk: Path, tmp_path: Path) -> None:
    root = driver_root(tmp_path, libcuda=False)
    env = ToolkitEnv(tmp_path, DriverEdits(config(ctk, root)))
    out = env.prepare_one(make_claim("a", [("gpu", "gpu-0")]))
    assert out.error is not None
    assert f"found no libcuda.so.{VERSION}" in out.error and str(root / LIB.lstrip("/")) in out.error
    assert not any(env.cdi_root.glob("*.json")), "no spec (claim or metadata) is left for a container to start with"
    fakedriver.make_driver_root(root, log=False)  # once the driver is there, the next prepare works
    again = env.prepare_one(make_claim("b", [("gpu", "gpu-1")]))
    assert again.error is None, again.error


def test_fake_nvidia_smi_prints_the_gpus_it_was_given(tmp_path: Path) -> None:
    root = fakedriver.make_driver_root(tmp_path / "driver", log=False)
    out = subprocess.run([str(root / "usr/bin/nvidia-smi")], env={"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"},
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["GPU 0: NVIDIA fake GPU (UUID: GPU-a)", "GPU 1: NVIDIA fake GPU (UUID: GPU-b)"]


class NamedBackend:
    def __init__(self, name: str) -> None:
        self.name = name


def plugin_settings_for(root: Path, ctk: Path, *extra: str) -> Any:
    import argparse

    from dra_driver.node.settings import add_plugin_arguments, plugin_settings
    parser = argparse.ArgumentParser()
    add_plugin_arguments(parser)
    return plugin_settings(parser.parse_args([
        "--node-name", NODE, "--nvidia-driver-root", str(root), "--dev-root", str(root),
        "--nvidia-ctk-path", str(ctk), *extra]))


def test_the_plugin_stays_up_without_the_driver_with_a_log_line_and_a_metric(ctk: Path, tmp_path: Path) -> None:
    from dra_driver.node.metrics import METRICS
    from dra_driver.node.plugin import start_driver_edits

    class Log:
        def __init__(self) -> None:
            self.lines: list[tuple[str, str, dict[str, Any]]] = []

        def info(self, event: str, **kw: Any) -> None:
            self.lines.append(("info", event, kw))

        def error(self, event: str, **kw: Any) -> None:
            self.lines.append(("error", event, kw))

    root = driver_root(tmp_path, libcuda=False)
    log = Log()
    before = METRICS.value("driver_edits_generations_total", {"result": "error"})
    cache = start_driver_edits(plugin_settings_for(root, ctk), NamedBackend("nvml"), log)  # type: ignore[arg-type]
    assert cache is not None
    assert METRICS.value("driver_edits_available") == 0
    assert METRICS.value("driver_edits_generations_total", {"result": "error"}) == before + 1
    [(level, event, fields)] = log.lines
    assert level == "error" and "NVIDIA driver was not found" in event and f"libcuda.so.{VERSION}" in fields["error"]
    assert cache.config.hook_path == ctk.parent / "nvidia-cdi-hook"
    fakedriver.make_driver_root(root, log=False)
    cache.edits()
    assert METRICS.value("driver_edits_available") == 1


def test_only_the_nvml_backend_with_driver_edits_on_gets_them(ctk: Path, tmp_path: Path) -> None:
    from dra_driver.node.plugin import start_driver_edits

    class Quiet:
        def info(self, *_a: Any, **_kw: Any) -> None: ...

    root = driver_root(tmp_path)
    assert start_driver_edits(plugin_settings_for(root, ctk), NamedBackend("simulated"), Quiet()) is None  # type: ignore[arg-type]
    assert start_driver_edits(plugin_settings_for(root, ctk, "--no-driver-edits"), NamedBackend("nvml"), Quiet()) is None  # type: ignore[arg-type]
    host = plugin_settings_for(root, ctk, "--host-driver-root", "/run/nvidia/driver", "--nvidia-cdi-hook-path", "/opt/h")
    cache = start_driver_edits(host, NamedBackend("nvml"), Quiet())  # type: ignore[arg-type]
    assert cache is not None
    edits = cache.edits()
    assert mounts(edits)["/usr/bin/nvidia-smi"] == "/run/nvidia/driver/usr/bin/nvidia-smi"
    assert {h["path"] for h in edits["hooks"]} == {"/opt/h"}
