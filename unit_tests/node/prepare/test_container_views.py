"""Each container of a claim is told of the devices it was given: a view per request, one for the
whole claim (:mod:`dra_driver.node.prepare.views`), as the kubelet and CDI hand them out
(:func:`nodefix.container_env`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from nodefix import DRIVER, Env, container_env, make_claim

from dra_driver.node.prepare.views import WHOLE_CLAIM


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def test_four_mig_devices_of_one_gpu_each_in_its_own_container(env: Env) -> None:
    """NVIDIA's gpu-test4: one claim, four requests of one MIG device each, a container per request."""
    results = [("mig-1", "gpu-3-1g-0"), ("mig-2", "gpu-3-1g-1"), ("mig-3", "gpu-2-mig-0"), ("mig-4", "gpu-2-mig-1")]
    claim = make_claim("c", results)
    uid = claim["metadata"]["uid"]
    out = env.prepare_one(claim)
    assert out.error is None
    specs = env.specs(uid)
    uuids = []
    for request, device in results:
        told = container_env(specs, out.devices, request)
        (uuid,) = told["NVIDIA_VISIBLE_DEVICES"].split(",")
        assert (told["DRA_GPU_COUNT"], told["DRA_GPU_DEVICES"], told["DRA_GPU_0_DEVICE"]) == ("1", device, device)
        assert told["DRA_GPU_0_UUID"] == uuid and "DRA_GPU_1_DEVICE" not in told
        uuids.append(uuid)
    assert len(set(uuids)) == 4
    whole = container_env(specs, out.devices)
    assert whole["NVIDIA_VISIBLE_DEVICES"].split(",") == uuids and whole["DRA_GPU_COUNT"] == "4"
    assert [whole[f"DRA_GPU_{i}_DEVICE"] for i in range(4)] == [d for _, d in results]
    assert whole["DRA_GPU_CLAIM_UID"] == uid and whole["DRA_GPU_DRIVER"] == DRIVER
    # The whole claim's view goes out as an entry of its own, last, which no container can name.
    assert out.devices[-1].request_names == (WHOLE_CLAIM,)
    assert out.devices[-1].cdi_device_ids == (f"k8s.{DRIVER}/claim={uid}-claim",)
    assert (out.devices[-1].pool_name, out.devices[-1].device_name) == (out.devices[-2].pool_name, "gpu-2-mig-1")


def test_the_whole_claims_view_empties_what_only_a_requests_view_set(env: Env) -> None:
    claim = make_claim("c", [("plain", "gpu-0"), {"request": "admin", "device": "gpu-1", "adminAccess": True}])
    out = env.prepare_one(claim)
    assert out.error is None
    specs = env.specs(claim["metadata"]["uid"])
    assert container_env(specs, out.devices, "admin")["DRA_GPU_0_ADMIN_ACCESS"] == "true"
    whole = container_env(specs, out.devices)
    assert whole["DRA_GPU_0_DEVICE"] == "gpu-0" and whole["DRA_GPU_0_ADMIN_ACCESS"] == ""
    assert whole["DRA_GPU_1_ADMIN_ACCESS"] == "true"
    assert "DRA_GPU_0_ADMIN_ACCESS" not in container_env(specs, out.devices, "plain")


def test_a_claim_of_one_request_keeps_the_layout_of_before(env: Env) -> None:
    claim = make_claim("c", [("gpu", "gpu-0"), ("gpu", "gpu-1")])
    uid = claim["metadata"]["uid"]
    out = env.prepare_one(claim)
    assert out.error is None
    assert [d.cdi_device_ids for d in out.devices] == [(f"k8s.{DRIVER}/claim={uid}-gpu-0",),
                                                       (f"k8s.{DRIVER}/claim={uid}-gpu-1",)]
    assert not env.views_path(uid).exists()
    assert container_env(env.specs(uid), out.devices, "gpu") == container_env(env.specs(uid), out.devices)


def test_views_are_removed_with_the_claim_and_rewritten_when_lost(env: Env) -> None:
    claim = make_claim("c", [("a", "gpu-0"), ("b", "gpu-1")])
    uid = claim["metadata"]["uid"]
    ref = env.reader.add(claim)
    first = env.state.prepare([ref])[ref.uid]
    views = env.views_path(uid)
    written = views.read_bytes()
    env.state.close()
    views.write_bytes(b"")  # a power loss tore it (it is not fsynced)
    env.state = env.new_state(boot="boot-2")
    assert views.read_bytes() == written
    assert env.state.prepare([ref])[ref.uid] == first
    assert env.state.unprepare([ref]) == {ref.uid: None}
    assert not views.exists() and not env.spec_exists(uid)


def test_views_an_earlier_release_left_are_removed_at_start(env: Env) -> None:
    claim = make_claim("c", [("a", "gpu-0"), ("b", "gpu-1")])
    kept = make_claim("k", [("a", "gpu-2-mig-0"), ("b", "gpu-2-mig-1")])
    ref = env.reader.add(claim)
    assert env.state.prepare([ref])[ref.uid].error is None and env.prepare_one(kept).error is None
    views = env.views_path(ref.uid)
    left = views.read_bytes()
    assert env.state.unprepare([ref]) == {ref.uid: None}
    env.state.close()
    views.write_bytes(left)  # as a release from before views unprepares: the claim's spec removed, this not
    env.state = env.new_state()
    assert not views.exists()
    assert env.views_path(kept["metadata"]["uid"]).exists()
