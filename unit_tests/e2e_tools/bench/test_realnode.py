"""The real-node bench's reading of the kubelet's -v=4 DRA lines (e2e/bench/realnode.py)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from e2e.bench import realnode

A = "0b5c5d8e-1111-4a4a-8b8b-000000000001"
B = "0b5c5d8e-1111-4a4a-8b8b-000000000002"
C = "0b5c5d8e-1111-4a4a-8b8b-000000000003"


def line(ts: str, msg: str, driver: str, payload: str) -> str:
    return (f'I1123 {ts}   31337 dra_plugin.go:97] "{msg}" logger="dra-plugin" driverName="{driver}" '
            f'endpoint="/tmp/x/dra.sock" {payload}')


def test_calls_are_paired_by_claim_uid_when_they_overlap() -> None:
    ours, base = realnode.DRIVER_NAME, realnode.BASELINE_DRIVER
    log = [
        line("22:40:01.000000", "Calling NodePrepareResources rpc", ours, f'request="&Claims:[{{UID:{A}}}]"'),
        line("22:40:01.002000", "Calling NodePrepareResources rpc", ours, f'request="&Claims:[{{UID:{B}}}]"'),
        line("22:40:01.003000", "Calling NodePrepareResources rpc", base, f'request="&Claims:[{{UID:{C}}}]"'),
        line("22:40:01.020000", "Done calling NodePrepareResources rpc", ours,
             f'response="&Claims:map[{B}:&Devices:[gpu.dra-driver.io/gpu={B}-gpu-1]]" err=null'),
        line("22:40:01.030000", "Done calling NodePrepareResources rpc", ours, f'response="&Claims:map[{A}:&]" err=null'),
        line("22:40:01.008000", "Done calling NodePrepareResources rpc", base, f'response="&Claims:map[{C}:&]" err=null'),
        'I1123 22:40:02.000000   31337 kubelet.go:1] "SyncLoop ADD" source="api"',
        line("22:40:05.000000", "Calling NodeUnprepareResource rpc", ours, f'request="&Claims:[{{UID:{A}}}]"'),
        line("22:40:05.004500", "Done calling NodeUnprepareResources rpc", ours, f'response="&Claims:map[{A}:&]"'),
    ]
    events = realnode.parse_kubelet_log(log)
    assert len(events) == 8
    durations, unfinished = realnode.call_durations(events, ours, "prepare", {A, B})
    assert sorted(round(d * 1000, 3) for d in durations) == [18.0, 30.0]
    assert unfinished == 0
    base_durations, _ = realnode.call_durations(events, base, "prepare", {C})
    assert [round(d * 1000, 3) for d in base_durations] == [5.0]
    unprepare, _ = realnode.call_durations(events, ours, "unprepare", {A})
    assert [round(d * 1000, 3) for d in unprepare] == [4.5]


def test_a_call_without_its_done_line_is_counted_unfinished() -> None:
    ours = realnode.DRIVER_NAME
    events = realnode.parse_kubelet_log([
        line("23:59:59.990000", "Calling NodePrepareResources rpc", ours, f'request="{A}"'),
        line("00:00:00.010000", "Done calling NodePrepareResources rpc", ours, f'response="{A}"'),
        line("00:00:01.000000", "Calling NodePrepareResources rpc", ours, f'request="{B}"'),
    ])
    durations, unfinished = realnode.call_durations(events, ours, "prepare", {A, B})
    assert [round(d * 1000, 3) for d in durations] == [20.0], "a call across midnight"
    assert unfinished == 1


def test_other_claims_and_drivers_are_left_out() -> None:
    events = realnode.parse_kubelet_log([
        line("10:00:00.000000", "Calling NodePrepareResources rpc", "other.example.com", f'request="{A}"'),
        line("10:00:00.001000", "Done calling NodePrepareResources rpc", "other.example.com", f'response="{A}"'),
    ])
    assert realnode.call_durations(events, realnode.DRIVER_NAME, "prepare", {A}) == ([], 0)
    assert realnode.call_durations(events, "other.example.com", "prepare", {B}) == ([], 0)


def test_the_bench_profile_has_one_device_per_burst_pod(tmp_path: Path) -> None:
    from dra_driver.node.discovery.profiles import load_profile

    profile = load_profile(realnode.sixteen_gpu_profile(tmp_path / "p.yaml"))
    assert len(profile.gpus) == realnode.GPUS >= realnode.BURST
    assert len({g.pci_bus_id for g in profile.gpus}) == realnode.GPUS


def test_profile_counts_only_the_prepare_handler_and_names_the_part_nearest_the_leaf() -> None:
    handler = "thread (0x7f);_serve (grpc/_server.py:1314);NodePrepareResources (dra_driver/node/kubelet/grpc.py:286)"
    state, write = "dra_driver/node/prepare/state.py", "atomic_write (dra_driver/node/fileio.py:96)"
    commit, node = "dra_driver/node/prepare/groupcommit.py", "dra_driver/node/prepare/materialize.py"
    stacks = [
        f"{handler};prepare ({state}:578);RestKubeApi.get (dra_driver/k8s/client.py:430);"
        "do_handshake (/usr/lib/python3.11/ssl.py:1383) 30",
        f"{handler};prepare ({state}:578);CdiSpecs.write_claim_spec (dra_driver/node/prepare/cdi.py:280);"
        f"{write} 10",
        f"{handler};GroupCommit.run ({commit}:40);Materializer.write ({node}:90);"
        f"Materializer._write_metadata ({node}:104);{write} 6",
        f"{handler};GroupCommit.run ({commit}:38);wait (threading.py:320) 8",
        f"{handler};prepare ({state}:578);info (structlog/_native.py:1);"
        "dumps (json/__init__.py:231) 5",
        f"{handler};prepare ({state}:600) 4",
        f"{handler};x (/usr/lib/python3.11/threading.py:1) 1",
        "thread (0x7f);run (dra_driver/node/publish/slices.py:12);RestKubeApi.get (dra_driver/k8s/client.py:430) 999",
        "not a stack line",
    ]
    parts = realnode.profile_breakdown(stacks, rate_hz=1000, calls=2)
    assert parts == {"claim read (HTTP, TLS, JSON)": 15.0, "CDI spec (build + atomic write)": 5.0,
                     "group commit (queueing, bookkeeping)": 4.0, "device metadata files": 3.0,
                     "logging (structlog)": 2.5, "prepare logic (config, sharing, devices)": 2.0,
                     "gRPC server and protobuf": 0.5}
    assert next(iter(parts)) == "claim read (HTTP, TLS, JSON)", "largest first"


def test_cpu_seconds_counts_threads_that_have_ended() -> None:
    """A plugin's pool threads come and go during a burst; their CPU must stay in the per-pod figure."""
    def burn() -> None:
        end = time.thread_time() + 0.15
        while time.thread_time() < end:
            pass

    before = realnode.cpu_seconds(os.getpid())
    worker = threading.Thread(target=burn)
    worker.start()
    worker.join()
    assert realnode.cpu_seconds(os.getpid()) - before >= 0.1
