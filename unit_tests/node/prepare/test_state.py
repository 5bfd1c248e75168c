"""DeviceState: the prepare/unprepare semantics of the node plugin."""

from __future__ import annotations

import errno
import os
import threading
import time
import uuid
from typing import Any

import pytest
import structlog
from nodefix import DRIVER, MPS, NODE, TS, Env, env_of, gpu_config, make_claim, nvidia_config

from dra_driver.gpuconfig import EXCLUSIVE
from dra_driver.node.metrics import METRICS
from dra_driver.node.prepare.calls import ClaimRef
from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.checkpoint import CheckpointStore
from dra_driver.node.prepare.entries import ClaimEntry, ClaimState, DeviceKind, PreparedDevice
from dra_driver.node.prepare.plan import ClaimPlanner
from dra_driver.node.prepare.state import DeviceState


class TestPrepare:
    def test_single_gpu(self, env: Env) -> None:
        claim = make_claim("c1", [("gpu", "gpu-0")])
        uid = claim["metadata"]["uid"]
        out = env.prepare_one(claim)
        assert out.error is None
        [dev] = out.devices
        assert dev.request_names == ("gpu",)
        assert dev.pool_name == NODE and dev.device_name == "gpu-0"
        assert dev.cdi_device_ids == (f"k8s.{DRIVER}/claim={uid}-gpu-0",)
        assert dev.share_id is None
        spec = env.spec(uid)
        assert spec["devices"][0]["name"] == f"{uid}-gpu-0"
        assert env_of(spec["containerEdits"])["DRA_GPU_CLAIM"] == "default/c1"
        assert env_of(spec["containerEdits"])["NVIDIA_VISIBLE_DEVICES"] == env.devices["gpu-0"].gpu.uuid
        cp = env.checkpoint()[uid]
        assert cp["state"] == "PrepareCompleted"
        assert cp["devices"][0]["cdiDeviceIDs"] == [f"k8s.{DRIVER}/claim={uid}-gpu-0"]

    def test_subrequest_names_are_stripped_and_share_id_kept(self, env: Env) -> None:
        share = str(uuid.uuid4())
        claim = make_claim("c", [{"request": "gpu/big", "device": "gpu-0", "shareID": share},
                                 {"request": "other", "device": "gpu-1"}])
        out = env.prepare_one(claim)
        assert out.error is None
        assert [d.request_names for d in out.devices] == [("gpu",), ("other",)]
        assert [d.share_id for d in out.devices] == [share, None]
        env_dev0 = env_of(env.spec(claim["metadata"]["uid"])["devices"][0]["containerEdits"])
        assert env_dev0["DRA_GPU_0_REQUEST"] == "gpu/big"

    def test_results_of_other_drivers_ignored(self, env: Env) -> None:
        claim = make_claim("c", [("gpu", "gpu-0")])
        claim["status"]["allocation"]["devices"]["results"].append(
            {"driver": "net.example.com", "pool": "x", "device": "nic-0", "request": "nic"})
        out = env.prepare_one(claim)
        assert out.error is None and [d.device_name for d in out.devices] == ["gpu-0"]

    def test_no_results_of_ours(self, env: Env) -> None:
        claim = make_claim("c", [])
        out = env.prepare_one(claim)
        assert out.error is None and out.devices == ()
        assert not env.spec_exists(claim["metadata"]["uid"])

    def test_no_node_selector_is_fine(self, env: Env) -> None:
        out = env.prepare_one(make_claim("c", [("gpu", "gpu-0")], node=None))
        assert out.error is None

    def test_config_applied(self, env: Env) -> None:
        claim = make_claim("c", [("gpu", "gpu-0")], config=[
            gpu_config({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}, source="FromClass"),
            gpu_config(MPS, requests=["gpu"]),
        ])
        assert env.prepare_one(claim).error is None
        spec = env.spec(claim["metadata"]["uid"])
        assert env_of(spec["devices"][0]["containerEdits"])["DRA_GPU_0_SHARING"] == \
            "MPS:defaultActiveThreadPercentage=50"
        assert env_of(spec["devices"][0]["containerEdits"])["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"

    def test_nvidia_config_reaches_the_same_prepare(self, env: Env) -> None:
        """NVIDIA's quickstart gpu-test5 configs: a time-sliced GPU with the Long interval set on it,
        and an MPS GPU whose clients get the limits, as this driver's own GpuConfig would."""
        claim = make_claim("c", [("ts-gpu", "gpu-0"), ("mps-gpu", "gpu-1")], config=[
            nvidia_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}, ["ts-gpu"]),
            nvidia_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50,
                                                            "defaultPinnedDeviceMemoryLimit": "10Gi"}}, ["mps-gpu"]),
        ])
        assert env.prepare_one(claim).error is None
        assert env.gpus.time_slices[env.devices["gpu-0"].gpu.uuid] == 3
        spec = env.spec(claim["metadata"]["uid"])
        assert env_of(spec["devices"][0]["containerEdits"])["DRA_GPU_0_SHARING"] == "TimeSlicing:Long"
        assert env_of(spec["devices"][1]["containerEdits"])["DRA_GPU_1_SHARING"] == \
            "MPS:defaultActiveThreadPercentage=50,defaultPinnedDeviceMemoryLimit=10Gi"
        # Only the MPS GPU's containers are MPS clients (gpu-test5's ts-ctr0/1 name the other request).
        ts_env, mps_env = (env_of(d["containerEdits"]) for d in spec["devices"])
        assert not any(k.startswith("CUDA_MPS_") for k in {**env_of(spec["containerEdits"]), **ts_env})
        assert mps_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        assert mps_env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "1=10240M"

    def test_nvidia_mig_device_config(self, env: Env) -> None:
        claim = make_claim("c", [("mig", "gpu-2-mig-1")], config=[
            nvidia_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 30}},
                          kind="MigDeviceConfig")])
        assert env.prepare_one(claim).error is None
        spec = env.spec(claim["metadata"]["uid"])
        assert env_of(spec["devices"][0]["containerEdits"])["DRA_GPU_0_SHARING"] == \
            "MPS:defaultActiveThreadPercentage=30"

    @pytest.mark.parametrize(("parameters", "message"), [
        ({"kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50,
                                                                             "threads": 2}}},
         "devices.config[0].opaque.parameters.sharing.mpsConfig.threads: unknown field"),
        ({"kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "LegacyOnly"}},
         "devices.config[0].opaque.parameters.kind: VfioDeviceConfig is NVIDIA's VFIO passthrough"),
        ({"kind": "ComputeDomainChannelConfig", "domainID": "d"},
         "devices.config[0].opaque.parameters.kind: ComputeDomainChannelConfig is NVIDIA's ComputeDomains"),
        ({"kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}},
         "devices.config[0].opaque.parameters.kind: MigDeviceConfig cannot be applied to device 'gpu-0'"),
    ])
    def test_nvidia_config_refused_names_it(self, env: Env, parameters: dict[str, Any], message: str) -> None:
        config = {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", **parameters}}}
        claim = make_claim("c", [("gpu", "gpu-0")], config=[config])
        err = env.prepare_one(claim).error or ""
        assert err.startswith(f"invalid {DRIVER} config for request 'gpu': {message}"), err
        assert not env.spec_exists(claim["metadata"]["uid"])
        assert env.gpus.calls == [] and env.state.prepared_claims() == {}

    def test_static_mig(self, env: Env) -> None:
        claim = make_claim("c", [("gpu", "gpu-2-mig-1")])
        assert env.prepare_one(claim).error is None
        spec = env.spec(claim["metadata"]["uid"])
        nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
        # gi 8 on GPU minor 2: 3 + 2*135 + 8*9 = 345, ci0 = 346
        assert nodes == ["/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap345", "/dev/nvidia-caps/nvidia-cap346"]
        assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] == str(env.tmp / "devroot/dev/nvidia2")
        assert env_of(spec["containerEdits"])["NVIDIA_VISIBLE_DEVICES"] == "MIG-2-1"

    def test_dynamic_mig_created_and_destroyed(self, env: Env) -> None:
        claim = make_claim("c", [("gpu", "gpu-3-1g-1")])
        uid = claim["metadata"]["uid"]
        assert env.prepare_one(claim).error is None
        assert env.backend.created == ["MIG-dyn-1"]
        assert env_of(env.spec(uid)["containerEdits"])["NVIDIA_VISIBLE_DEVICES"] == "MIG-dyn-1"
        assert env.checkpoint()[uid]["devices"][0]["migInstance"]["uuid"] == "MIG-dyn-1"
        assert env.state.unprepare([ClaimRef(uid, "default", "c")]) == {uid: None}
        assert env.backend.destroyed == ["MIG-dyn-1"]
        assert env.backend.live == {}

    def test_a_serialize_lock_that_fails_answers_every_claim(self, env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        other = env.reader.add(make_claim("d", [("gpu", "gpu-1")]))

        def no_lock() -> None:
            raise OSError(errno.ENOLCK, "No locks available")

        monkeypatch.setattr(env.state._shared.lock, "acquire", no_lock)
        out = env.state.prepare([ref, other])
        assert set(out) == {ref.uid, other.uid}
        assert all("internal error preparing the claim" in (o.error or "") for o in out.values())
        assert "internal error unpreparing the claim" in (env.state.unprepare([ref])[ref.uid] or "")

    def test_empty(self, env: Env) -> None:
        assert env.state.prepare([]) == {}
        assert env.state.unprepare([]) == {}


    def test_reading_the_prepared_claims_never_waits_for_a_batch(self, env: Env) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        assert env.state.prepare([ref])[ref.uid].error is None
        holding, release = threading.Event(), threading.Event()

        def next_batch() -> None:  # another batch, busy with its durable writes
            with env.state._lock:
                holding.set()
                release.wait(5)

        busy = threading.Thread(target=next_batch)
        busy.start()
        try:
            assert holding.wait(5)
            started = time.monotonic()
            assert list(env.state.prepared_claims()) == [ref.uid]
            assert time.monotonic() - started < 1
        finally:
            release.set()
            busy.join(5)


class TestIdempotency:
    def test_same_answer_twice(self, env: Env) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0"), ("gpu", "gpu-1")]))
        first = env.state.prepare([ref])[ref.uid]
        second = env.state.prepare([ref])[ref.uid]
        assert first == second and first.error is None

    def test_missing_spec_rewritten(self, env: Env) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        first = env.state.prepare([ref])[ref.uid]
        (env.cdi_root / f"k8s.{DRIVER}-claim_{ref.uid}.json").unlink()
        assert env.state.prepare([ref])[ref.uid] == first
        assert env.spec_exists(ref.uid)

    def test_dynamic_mig_not_created_twice(self, env: Env) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-3-1g-0")]))
        env.state.prepare([ref])
        env.state.prepare([ref])
        assert env.backend.created == ["MIG-dyn-1"]

    def test_unprepare_unknown_is_success(self, env: Env) -> None:
        uid = str(uuid.uuid4())
        assert env.state.unprepare([ClaimRef(uid, "ns", "gone")]) == {uid: None}
        assert env.state.unprepare([ClaimRef("not-a-uid", "ns", "gone")]) == {"not-a-uid": None}

    def test_unprepare_twice(self, env: Env) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        env.state.prepare([ref])
        assert env.state.unprepare([ref]) == {ref.uid: None}
        assert not env.spec_exists(ref.uid)
        assert ref.uid not in env.checkpoint()
        assert env.state.unprepare([ref]) == {ref.uid: None}

    def test_unprepare_removes_leftover_spec_of_unknown_claim(self, env: Env) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        env.state.prepare([ref])
        env.state._ledger.entries.clear()  # simulate a lost entry
        assert env.state.unprepare([ref]) == {ref.uid: None}
        assert not env.spec_exists(ref.uid)


# --- errors -----------------------------------------------------------------------------------


class TestErrors:
    def test_not_found(self, env: Env) -> None:
        uid = str(uuid.uuid4())
        out = env.state.prepare([ClaimRef(uid, "ns", "missing")])
        assert "ResourceClaim ns/missing not found" in (out[uid].error or "")

    def test_api_error(self, env: Env) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        env.reader.errors[("default", "c")] = RuntimeError("API server: 500 boom")
        assert "could not get ResourceClaim default/c: API server: 500 boom" in (
            env.state.prepare([ref])[ref.uid].error or "")

    def test_uid_mismatch(self, env: Env) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        other = str(uuid.uuid4())
        err = env.state.prepare([ClaimRef(other, ref.namespace, ref.name)])[other].error or ""
        assert "claim was replaced" in err and ref.uid in err

    def test_not_allocated(self, env: Env) -> None:
        assert "is not allocated" in (env.prepare_one(make_claim("c", [], allocated=False)).error or "")

    def test_other_node(self, env: Env) -> None:
        err = env.prepare_one(make_claim("c", [("gpu", "gpu-0")], node="node-b")).error or ""
        assert "allocated to another node" in err

    def test_not_in_matches(self, env: Env) -> None:
        claim = make_claim("c", [("gpu", "gpu-0")])
        claim["status"]["allocation"]["nodeSelector"] = {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [NODE]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE, "x"]}]},
        ]}
        assert env.prepare_one(claim).error is None  # second term matches

    def test_label_requirements_hold_where_the_plugin_cannot_see_labels(self, env: Env) -> None:
        labels = [{"key": "zone", "operator": "In", "values": ["z1"]}]
        claim = make_claim("c", [("gpu", "gpu-0")])
        claim["status"]["allocation"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchExpressions": labels}]}
        assert env.prepare_one(claim).error is None
        other = make_claim("d", [("gpu", "gpu-1")])
        other["status"]["allocation"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchExpressions": labels, "matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}]}
        assert "allocated to another node" in (env.prepare_one(other).error or "")

    def test_unknown_device(self, env: Env) -> None:
        err = env.prepare_one(make_claim("c", [("gpu", "gpu-0"), ("gpu", "gpu-99")])).error or ""
        assert "'gpu-99'" in err and "not a device" in err
        assert env.state.prepared_claims() == {}

    def test_wrong_pool(self, env: Env) -> None:
        err = env.prepare_one(make_claim("c", [{"request": "gpu", "device": "gpu-0", "pool": "node-b"}])).error or ""
        assert "pool 'node-b'" in err

    def test_bad_config_names_field(self, env: Env) -> None:
        claim = make_claim("c", [("gpu", "gpu-0")], config=[
            gpu_config({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 150}})])
        err = env.prepare_one(claim).error or ""
        assert "sharing.mps.defaultActiveThreadPercentage: must be between 1 and 100, got 150" in err
        assert not env.spec_exists(claim["metadata"]["uid"])

    def test_bad_claim_uid(self, env: Env) -> None:
        claim = make_claim("c", [("gpu", "gpu-0")], uid="../../etc/passwd")
        ref = env.reader.add(claim)
        err = env.state.prepare([ref])[ref.uid].error or ""
        assert "not a lower-case RFC 4122 UUID" in err
        assert not env.cdi_root.exists() or list(env.cdi_root.iterdir()) == []

    def test_errors_do_not_affect_other_claims(self, env: Env) -> None:
        good = env.reader.add(make_claim("good", [("gpu", "gpu-0")]))
        bad = env.reader.add(make_claim("bad", [("gpu", "nope")]))
        out = env.state.prepare([good, bad])
        assert out[good.uid].error is None and out[bad.uid].error

    def test_unexpected_exception_becomes_error(self, env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))

        def boom(*a: Any) -> Any:
            raise ZeroDivisionError("bug")

        monkeypatch.setattr(ClaimPlanner, "plan", boom)
        assert "internal error" in (env.state.prepare([ref])[ref.uid].error or "")
        monkeypatch.setattr(env.state, "_prepare_locked", boom)
        assert "internal error" in (env.state.prepare([ref])[ref.uid].error or "")
        monkeypatch.setattr(env.state, "_unprepare_locked", boom)
        assert "internal error" in (env.state.unprepare([ref])[ref.uid] or "")


class TestDiskFull:
    def _enospc(self, *a: Any, **k: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def test_cdi_write_enospc(self, env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
        import dra_driver.node.prepare.cdi as cdi_mod

        monkeypatch.setattr(cdi_mod, "atomic_write", self._enospc)
        claim = make_claim("c", [("gpu", "gpu-3-1g-0")])
        out = env.prepare_one(claim)
        assert "no space left on device" in (out.error or "")
        assert "CDI spec" in (out.error or "")
        uid = claim["metadata"]["uid"]
        assert uid not in env.state.prepared_claims()
        assert env.backend.live == {}  # the MIG instance was rolled back
        monkeypatch.undo()
        # the retry works and the device is not considered held by the failed attempt
        assert env.state.prepare([ClaimRef(uid, "default", "c")])[uid].error is None

    def test_checkpoint_enospc(self, env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
        import dra_driver.node.prepare.checkpoint as cp_mod

        monkeypatch.setattr(cp_mod, "atomic_write", self._enospc)
        claim = make_claim("c", [("gpu", "gpu-0")])
        out = env.prepare_one(claim)
        assert "no space left on device" in (out.error or "") and "checkpoint" in (out.error or "")
        assert env.state.prepared_claims() == {}
        assert not env.spec_exists(claim["metadata"]["uid"])

    def test_completed_record_enospc(self, env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
        first = env.reader.add(make_claim("a", [("gpu", "gpu-1")]))
        assert env.state.prepare([first])[first.uid].error is None  # the file exists: later saves append
        real = os.write
        records: list[bytes] = []

        def second_record_fails(fd: int, data: Any) -> int:
            if bytes(data[:14]) == b'{"checksum":"s':
                records.append(bytes(data))
                if len(records) == 2:
                    raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data)

        monkeypatch.setattr(os, "write", second_record_fails)
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        out = env.state.prepare([ref])[ref.uid]
        monkeypatch.undo()
        assert "no space left on device" in (out.error or "") and "checkpoint" in (out.error or "")
        assert ref.uid not in env.state.prepared_claims() and not env.spec_exists(ref.uid)
        assert set(env.checkpoint()) == {first.uid}
        assert env.state.prepare([ref])[ref.uid].error is None

    def test_unprepare_checkpoint_enospc_retries(self, env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        env.state.prepare([ref])
        monkeypatch.setattr(os, "write", self._enospc)
        assert "no space left" in (env.state.unprepare([ref])[ref.uid] or "")
        assert ref.uid in env.state.prepared_claims()
        monkeypatch.undo()
        assert env.state.unprepare([ref]) == {ref.uid: None}
        assert env.checkpoint() == {}


# --- exclusivity ------------------------------------------------------------------------------


class TestExclusivity:
    def test_same_gpu_two_exclusive_claims(self, env: Env) -> None:
        a = env.reader.add(make_claim("a", [("gpu", "gpu-0")]))
        b = env.reader.add(make_claim("b", [("gpu", "gpu-0")]))
        assert env.state.prepare([a])[a.uid].error is None
        err = env.state.prepare([b])[b.uid].error or ""
        assert "already prepared for claim default/a" in err and a.uid in err
        assert not env.spec_exists(b.uid)
        env.state.unprepare([a])
        assert env.state.prepare([b])[b.uid].error is None

    def test_same_batch(self, env: Env) -> None:
        a = env.reader.add(make_claim("a", [("gpu", "gpu-1")]))
        b = env.reader.add(make_claim("b", [("gpu", "gpu-1")]))
        out = env.state.prepare([a, b])
        assert out[a.uid].error is None and "already prepared" in (out[b.uid].error or "")

    @pytest.mark.parametrize(("sa", "sb", "ok"), [
        (TS, TS, True),
        (MPS, {"strategy": "MPS"}, True),
        (TS, MPS, False),
        (TS, None, False),
        (None, TS, False),
        ({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}, TS, False),
    ])
    def test_sharing(self, env: Env, sa: Any, sb: Any, ok: bool) -> None:
        a = env.reader.add(make_claim("a", [("gpu", "gpu-0")], config=[gpu_config(sa)] if sa else None))
        b = env.reader.add(make_claim("b", [("gpu", "gpu-0")], config=[gpu_config(sb)] if sb else None))
        assert env.state.prepare([a])[a.uid].error is None
        assert (env.state.prepare([b])[b.uid].error is None) is ok

    def test_strategy_not_allowed_on_this_node(self, env: Env) -> None:
        env.state = DeviceState(
            node_name=NODE, driver_name=DRIVER, devices=env.devices,
            cdi=CdiSpecs(env.cdi_root, DRIVER, env.tmp / "devroot", node_name=NODE),
            checkpoint=CheckpointStore(env.tmp / "state", NODE, DRIVER, boot_id=env.boot),
            api=env.reader, backend=env.backend, proc_root=env.proc,
            sharing_strategies=("Exclusive", "TimeSlicing"),
        )
        a = env.reader.add(make_claim("a", [("gpu", "gpu-0")], config=[gpu_config(MPS)]))
        b = env.reader.add(make_claim("b", [("gpu", "gpu-1")], config=[gpu_config(TS)]))
        error = env.state.prepare([a])[a.uid].error or ""
        assert "sharing strategy MPS" in error and "allowed: Exclusive, TimeSlicing" in error
        assert not env.spec_exists(a.uid)
        assert env.state.prepare([b])[b.uid].error is None

    def test_mig_slice_blocks_parent_and_back(self, env: Env) -> None:
        a = env.reader.add(make_claim("a", [("gpu", "gpu-2-mig-0")]))
        b = env.reader.add(make_claim("b", [("gpu", "gpu-2")]))
        c = env.reader.add(make_claim("c", [("gpu", "gpu-2-mig-1")]))
        assert env.state.prepare([a])[a.uid].error is None
        assert "already prepared for claim default/a" in (env.state.prepare([b])[b.uid].error or "")
        assert env.state.prepare([c])[c.uid].error is None  # a different slice is fine
        env.state.unprepare([a, c])
        assert env.state.prepare([b])[b.uid].error is None
        assert "already prepared for claim default/b" in (env.state.prepare([a])[a.uid].error or "")

    def test_dynamic_mig_overlap(self, env: Env) -> None:
        a = env.reader.add(make_claim("a", [("gpu", "gpu-3-1g-1")]))
        b = env.reader.add(make_claim("b", [("gpu", "gpu-3-2g-0")]))  # placement 0..1 overlaps 1
        c = env.reader.add(make_claim("c", [("gpu", "gpu-3-1g-0")]))
        assert env.state.prepare([a])[a.uid].error is None
        assert env.state.prepare([b])[b.uid].error
        assert env.state.prepare([c])[c.uid].error is None
        assert env.backend.created == ["MIG-dyn-1", "MIG-dyn-2"]

    def test_admin_access_does_not_take_ownership(self, env: Env) -> None:
        a = env.reader.add(make_claim("a", [("gpu", "gpu-0")]))
        admin = env.reader.add(make_claim("adm", [{"request": "gpu", "device": "gpu-0", "adminAccess": True}]))
        assert env.state.prepare([a])[a.uid].error is None
        assert env.state.prepare([admin])[admin.uid].error is None
        b = env.reader.add(make_claim("b", [("gpu", "gpu-1")]))
        admin2 = env.reader.add(make_claim("adm2", [{"request": "gpu", "device": "gpu-1", "adminAccess": True}]))
        assert env.state.prepare([admin2])[admin2.uid].error is None
        assert env.state.prepare([b])[b.uid].error is None

    def test_share_ids_coexist(self, env: Env) -> None:
        a = env.reader.add(make_claim("a", [{"request": "gpu", "device": "gpu-0", "shareID": str(uuid.uuid4())}]))
        b = env.reader.add(make_claim("b", [{"request": "gpu", "device": "gpu-0", "shareID": str(uuid.uuid4())}]))
        assert env.state.prepare([a, b])[b.uid].error is None

    def test_same_device_twice_in_one_claim(self, env: Env) -> None:
        claim = make_claim("c", [("a", "gpu-0"), ("b", "gpu-0")])
        assert env.prepare_one(claim).error is None


# --- restart / reboot -------------------------------------------------------------------------


class TestRecovery:
    def test_restart_keeps_completed(self, env: Env) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-3-1g-0")]))
        first = env.state.prepare([ref])[ref.uid]
        env.state.close()
        state2 = env.new_state()
        assert ref.uid in state2.prepared_claims()
        assert state2.prepare([ref])[ref.uid] == first
        assert env.backend.created == ["MIG-dyn-1"]
        # the restarted plugin still enforces exclusivity
        other = env.reader.add(make_claim("o", [("gpu", "gpu-3-2g-0")]))
        assert state2.prepare([other])[other.uid].error
        assert state2.unprepare([ref]) == {ref.uid: None}
        assert env.backend.live == {}

    def _started_entry(self, env: Env, uid: str, device: str, with_mig: bool) -> None:
        dev = env.devices[device]
        mig_inst = None
        if with_mig:
            assert dev.mig_profile is not None and dev.placement is not None
            mig_inst = env.backend.create_mig_instance(dev.gpu, dev.mig_profile, dev.placement)
        else:
            assert dev.mig_profile is not None and dev.placement is not None
            env.backend.create_mig_instance(dev.gpu, dev.mig_profile, dev.placement)  # created, not recorded
        entry = ClaimEntry(uid, "default", "half", ClaimState.PREPARE_STARTED, (
            PreparedDevice(NODE, device, ("gpu",), (), EXCLUSIVE, None, False, "", dev.gpu.uuid,
                           dev.gpu.minor, (), mig_inst, DeviceKind.MIG, (dev.placement.start, dev.placement.size)),
        ), boot_id=env.boot)
        CheckpointStore(env.tmp / "state", NODE, DRIVER, boot_id=env.boot).save({uid: entry})

    @pytest.mark.parametrize("with_mig", [True, False])
    def test_started_entries_rolled_back(self, env: Env, with_mig: bool) -> None:
        uid = str(uuid.uuid4())
        self._started_entry(env, uid, "gpu-3-1g-1", with_mig)
        env.cdi_root.mkdir(exist_ok=True)
        (env.cdi_root / f"k8s.{DRIVER}-claim_{uid}.json").write_text("{}")
        assert len(env.backend.live) == 1
        state = env.new_state()
        assert state.prepared_claims() == {}
        assert env.backend.live == {}
        assert not env.spec_exists(uid)
        assert env.checkpoint() == {}

    def test_reboot_rewrites_specs_and_recreates_mig(self, env: Env) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-3-1g-0"), ("gpu", "gpu-0")]))
        assert env.state.prepare([ref])[ref.uid].error is None
        env.state.close()
        # reboot: /var/run/cdi emptied, MIG instances gone, new boot id
        for p in env.cdi_root.iterdir():
            p.unlink()
        env.backend.live.clear()
        state = env.new_state(boot="boot-2")
        assert env.spec_exists(ref.uid)
        assert env.backend.created == ["MIG-dyn-1", "MIG-dyn-2"]
        assert env_of(env.spec(ref.uid)["containerEdits"])["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-dyn-2,")
        assert env.checkpoint()[ref.uid]["bootID"] == "boot-2"
        assert state.prepare([ref])[ref.uid].error is None
        assert env.backend.created == ["MIG-dyn-1", "MIG-dyn-2"]

    def test_missing_spec_rewritten_at_start(self, env: Env) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        env.state.prepare([ref])
        (env.cdi_root / f"k8s.{DRIVER}-claim_{ref.uid}.json").unlink()
        env.new_state()
        assert env.spec_exists(ref.uid)

    def test_corrupt_checkpoint_starts_empty(self, env: Env) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        env.state.prepare([ref])
        (env.tmp / "state" / "checkpoint.json").write_text('{"kind": "DraDriverCheck')
        state = env.new_state()
        assert state.prepared_claims() == {}
        assert list((env.tmp / "state").glob("checkpoint.json.corrupt-*"))


# --- performance and logging ------------------------------------------------------------------


class TestConcurrency:
    def test_100_claims_gets_are_concurrent(self, env: Env) -> None:
        env.reader.delay = 0.05
        refs = [env.reader.add(make_claim(f"c{i}", [("gpu", "gpu-0")], config=[gpu_config(TS)]))
                for i in range(100)]
        start = time.monotonic()
        out = env.state.prepare(refs)
        elapsed = time.monotonic() - start
        assert all(o.error is None for o in out.values()), [o.error for o in out.values() if o.error][:3]
        assert len(out) == 100
        assert elapsed < 2.0, elapsed  # serial GETs alone would take 5 s
        assert len(env.state.prepared_claims()) == 100

    def test_parallel_calls_serialize_mutations(self, env: Env) -> None:
        refs = [env.reader.add(make_claim(f"c{i}", [("gpu", "gpu-1")])) for i in range(8)]
        results: dict[str, Any] = {}

        def run(r: ClaimRef) -> None:
            results.update(env.state.prepare([r]))

        threads = [threading.Thread(target=run, args=(r,)) for r in refs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(1 for o in results.values() if o.error is None) == 1


class TestLogging:
    def test_claim_log_lines_carry_context(self, env: Env) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        bad = env.reader.add(make_claim("bad", [("gpu", "gpu-77")]))
        with structlog.testing.capture_logs() as logs:
            env.state.prepare([ref, bad])
            env.state.unprepare([ref])
        claim_lines = [e for e in logs if "claim_uid" in e]
        assert {e["claim_uid"] for e in claim_lines} == {ref.uid, bad.uid}
        for e in claim_lines:
            assert e["node"] == NODE
            assert e["claim"] in ("default/c", "default/bad")
        events = {e["event"] for e in claim_lines}
        assert {"prepared claim", "cannot prepare claim", "unprepared claim"} <= events


class TestRecordedAhead:
    """A one-claim request is checkpointed while its ResourceClaim is read (prepare.py's docstring)."""

    def test_the_claim_is_on_disk_before_its_read_returns(self, env: Env) -> None:
        ref = env.reader.add(make_claim("c", [("gpu", "gpu-0")]))
        seen: dict[str, Any] = {}
        env.reader.while_reading = lambda name: seen.update(env.checkpoint())  # what another process finds on disk
        assert env.state.prepare([ref])[ref.uid].ok
        assert seen[ref.uid]["state"] == "PrepareStarted" and seen[ref.uid]["devices"] == []
        assert env.checkpoint()[ref.uid]["state"] == "PrepareCompleted"

    def test_a_claim_still_being_read_is_not_listed_as_prepared(self, env: Env) -> None:
        first = env.reader.add(make_claim("first", [("gpu", "gpu-0")]))
        second = env.reader.add(make_claim("second", [("gpu", "gpu-1")]))
        listed: dict[str, Any] = {}

        def prepare_the_second(name: str) -> None:
            if name == "first":  # the first claim is recorded, its answer not yet read
                assert env.state.prepare([second])[second.uid].ok
                listed.update(prepared=set(env.state.prepared_claims()), gauge=METRICS.value("prepared_claims", {}))

        env.reader.while_reading = prepare_the_second
        assert env.state.prepare([first])[first.uid].ok
        assert listed == {"prepared": {second.uid}, "gauge": 1}
        assert set(env.state.prepared_claims()) == {first.uid, second.uid}

    def test_a_claim_that_fails_leaves_no_entry(self, env: Env) -> None:
        ref = ClaimRef(str(uuid.uuid4()), "default", "gone")  # not in the reader: 404
        assert "not found" in (env.state.prepare([ref])[ref.uid].error or "")
        assert env.state.prepared_claims() == {}
        env.state = env.new_state()  # its record may still be on disk: rolled back, nothing to remove
        assert env.state.prepared_claims() == {}
        assert list(env.cdi_root.glob("*.json")) == []

    def test_a_claim_without_devices_of_this_driver_leaves_no_entry(self, env: Env) -> None:
        claim = make_claim("other", [{"request": "gpu", "device": "x", "driver": "other.example.com"}])
        ref = env.reader.add(claim)
        out = env.state.prepare([ref])[ref.uid]
        assert out.ok and out.devices == ()
        assert env.state.prepared_claims() == {}

    def test_a_dynamic_mig_claim_is_recorded_with_its_devices_before_the_instance_is_made(self, env: Env) -> None:
        ref = env.reader.add(make_claim("m", [("gpu", "gpu-3-1g-0")]))
        before: dict[str, Any] = {}
        create = env.backend.create_mig_instance

        def look_then_create(*args: Any) -> Any:
            before.update(env.checkpoint())
            return create(*args)

        env.backend.create_mig_instance = look_then_create  # type: ignore[method-assign]
        assert env.state.prepare([ref])[ref.uid].ok
        assert [d["device"] for d in before[ref.uid]["devices"]] == ["gpu-3-1g-0"]
