"""The fence ledger's pure parts (dra_driver.controller.fence) and the --allocation-ledger setting."""

from __future__ import annotations

import argparse

import pytest

from dra_driver.controller import fence
from dra_driver.controller.settings import add_controller_arguments, controller_settings
from dra_driver.flags import SettingsError

D = "gpu.dra-driver.io"


def test_keys_are_configmap_keys_and_unique() -> None:
    assert fence.ledger_key(D, "node-a", "gpu-0") == "gpu.dra-driver.io_node-a_gpu-0"
    # A pool with "/" (allowed in pool names, not in ConfigMap keys).
    assert fence.ledger_key(D, "rack-1/node-a", "gpu-0") == "gpu.dra-driver.io_rack-1_node-a_gpu-0"
    assert fence.ledger_key(D, "a", "b-c") != fence.ledger_key(D, "a-b", "c")


def test_reservation_adds_entries_and_replaces_the_sentinel() -> None:
    first = fence.with_reservation({}, [(D, "n", "gpu-0")], "uid-1", "gen-1", D)
    second = fence.with_reservation(first, [(D, "n", "gpu-1")], "uid-2", "gen-2", D)
    assert second == {f"{D}_n_gpu-0": "uid-1", f"{D}_n_gpu-1": "uid-2", f"fence.{D}_gen-2_probe": "fence"}
    assert fence.conflicting_entries(second, [(D, "n", "gpu-1")], "uid-1") == [f"{D}_n_gpu-1"]
    assert fence.conflicting_entries(second, [(D, "n", "gpu-1")], "uid-2") == []
    assert fence.keys_of(second, "uid-1") == [f"{D}_n_gpu-0"]


def test_stale_keys_spare_holders_and_claims_in_flight() -> None:
    data = {f"{D}_n_gpu-0": "holder", f"{D}_n_gpu-1": "gone", f"{D}_n_gpu-2": "busy", f"{D}_n_gpu-3": "holder",
            f"fence.{D}_gen-1_probe": "fence"}
    held = {"holder": {f"{D}_n_gpu-0"}}  # no longer holds gpu-3
    assert sorted(fence.stale_keys(data, held, {"busy"}, D)) == [f"{D}_n_gpu-1", f"{D}_n_gpu-3"]


def test_probe_carries_the_sentinel_under_an_existing_request() -> None:
    allocation = {"devices": {"results": [{"request": "gpu/h100", "driver": D, "pool": "n", "device": "gpu-0"}]},
                  "nodeSelector": {"nodeSelectorTerms": []}}
    probe = fence.probe_allocation(allocation, "gen-7", D)
    assert probe["devices"]["results"][0] == {"request": "gpu/h100", "driver": f"fence.{D}", "pool": "gen-7",
                                               "device": "probe"}
    assert len(allocation["devices"]["results"]) == 1  # the real allocation is untouched
    key = fence.ledger_key(f"fence.{D}", "gen-7", "probe")
    assert fence.denial_names(f"denied request: allocation fence: device {key} is held", key)
    assert not fence.denial_names(f"denied request: allocation fence: device {D}_n_gpu-0 is held", key)
    assert not fence.denial_names(f"admission webhook denied {key}", key)


def _settings(*argv: str) -> tuple[str, str]:
    parser = argparse.ArgumentParser()
    add_controller_arguments(parser)
    return controller_settings(parser.parse_args(list(argv))).allocation_ledger


def test_ledger_setting() -> None:
    assert _settings("--leader-election-namespace", "dra") == ("dra", "dra-driver-allocations")
    assert _settings("--allocation-ledger", "ops/gpu-ledger") == ("ops", "gpu-ledger")
    for bad in ("no-slash", "Ops/x", "ops/", "a/b/c"):
        with pytest.raises(SettingsError, match="allocation-ledger"):
            _settings("--allocation-ledger", bad)
