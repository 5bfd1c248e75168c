"""Node plugin start-up time and resident memory.

Per repetition a fresh plugin process (bed flags, simulated h100-8x) serves a fresh Node, so it
really publishes its slices. The benchmark plays the kubelet: it waits for the registration
socket, calls GetInfo and then NotifyRegistrationStatus, exactly the kubelet's two calls. Times
are from just before the process is spawned (Python start-up and imports included). RSS is
VmRSS from /proc/<pid>/status once the slices are published and registration is done, after a
second to settle; VmHWM (the peak) is kept too.
"""

from __future__ import annotations

import time
from pathlib import Path

from e2e.bench.common import Result, percentile, summarize_ms
from e2e.bench.plugin import RunningPlugin, notify_registered, start_plugin, vm_rss_kib, wait_get_info
from e2e.bench.sharedbed import NODES, BenchBed, wait_until


def _published(plugin: RunningPlugin) -> bool:
    log = plugin.procs.logs / f"plugin-{plugin.node.name}.log"
    return "published ResourceSlices" in log.read_text(errors="replace")


def _one(bed: BenchBed, root: Path, node: str, extra: tuple[str, ...], env: dict[str, str] | None = None
         ) -> dict[str, float]:
    bed.api.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    plugin = start_plugin(root, bed.kubeconfig, node, extra=extra, env=env)
    try:
        socket_s, info_s = wait_get_info(plugin)
        notify_registered(plugin.registration_socket)
        registered_s = time.monotonic() - plugin.spawned
        wait_until("slices published", lambda: _published(plugin) or plugin.procs.check_alive(), timeout=60)
        published_s = time.monotonic() - plugin.spawned
        time.sleep(1.0)
        mem = vm_rss_kib(plugin.pid)
    finally:
        plugin.stop()
    return {"socket_s": socket_s, "get_info_s": info_s, "registered_s": registered_s, "published_s": published_s,
            "rss_mib": mem["VmRSS"] / 1024, "hwm_mib": mem["VmHWM"] / 1024, "rss_anon_mib": mem.get("RssAnon", 0) / 1024}


def run(bed: BenchBed, quick: bool) -> Result:
    reps = 3 if quick else 10
    result = Result("plugin_start", "Node plugin start-up and memory", {
        "profile": "h100-8x", "repetitions": reps, "kubelet": "played by the benchmark (GetInfo + NotifyRegistrationStatus)",
        "rss_source": "/proc/<pid>/status VmRSS after registration and slice publication + 1 s",
    })
    root = bed.workdir / "startup"
    runs = [_one(bed, root, f"bench-start-{r}", ()) for r in range(reps)]
    mig = _one(bed, root, "bench-start-mig", ("--dynamic-mig",))
    # glibc gives every thread that allocates its own malloc arena; the plugin has ~50 threads
    # (gRPC pools, claim GETs), so this run shows how much of the RSS is arena overhead.
    arenas = _one(bed, root, "bench-start-arena", (), env={"MALLOC_ARENA_MAX": "2"})
    bed.remove_nodes([*(f"bench-start-{r}" for r in range(reps)), "bench-start-mig", "bench-start-arena"])

    def col(key: str) -> list[float]:
        return [r[key] for r in runs]

    registered = summarize_ms(col("registered_s"))
    rss = col("rss_mib")
    result.figures.update({
        "spawn_to_socket": summarize_ms(col("socket_s")),
        "spawn_to_get_info": summarize_ms(col("get_info_s")),
        "spawn_to_notify_registration_status": registered,
        "spawn_to_slices_published": summarize_ms(col("published_s")),
        "rss_mib": {"p50": round(percentile(rss, 50), 1), "max": round(max(rss), 1), "all": [round(x, 1) for x in rss]},
        "hwm_mib_max": round(max(col("hwm_mib")), 1),
        "rss_anon_mib_p50": round(percentile(col("rss_anon_mib"), 50), 1),
        "dynamic_mig": {k: round(v, 3) for k, v in mig.items()},
        "with_MALLOC_ARENA_MAX_2": {k: round(v, 3) for k, v in arenas.items()},
    })
    result.target("RSS after start (worst of runs)", max(rss), 80, "MiB")
    result.target("spawn → registered (NotifyRegistrationStatus), median", registered["p50_ms"] / 1000, 2, "s")
    result.notes.append(
        f"spawn→GetInfo p50 {result.figures['spawn_to_get_info']['p50_ms']:.0f} ms, →registered p50 "
        f"{registered['p50_ms']:.0f} ms / max {registered['max_ms']:.0f} ms; RSS p50 {percentile(rss, 50):.1f} MiB "
        f"(dynamic MIG: {mig['rss_mib']:.1f} MiB; with MALLOC_ARENA_MAX=2: {arenas['rss_mib']:.1f} MiB)."
    )
    return result
