"""What the controller does with a claim (:func:`classify`) and the opaque config it flags."""

from __future__ import annotations

import pytest
from ctrlfix import CLASS, DRIVER, allocated_status, claim, device_class, sharing_config

from dra_driver.controller import verdicts
from dra_driver.controller.keys import ALLOCATE_ANNOTATION, HASH_ANNOTATION, SUMMARY_ANNOTATION
from dra_driver.controller.verdicts import Action, claim_config_errors, classify, config_errors, object_config_errors
from dra_driver.k8s.claims import FINALIZER, POD_CLAIM_NAME_ANNOTATION


class TestClassify:
    def test_allocated(self) -> None:
        c = claim()
        c["status"] = allocated_status(["gpu-0"])
        assert classify(c, waited_for=True) is Action.IGNORE
        c["metadata"]["annotations"] = {SUMMARY_ANNOTATION: "x"}
        assert classify(c, waited_for=True) is Action.CLEAR

    def test_pending_for_pod_is_explained(self) -> None:
        assert classify(claim(), waited_for=True) is Action.EXPLAIN
        assert classify(claim(), waited_for=False) is Action.IGNORE

    def test_opt_in(self) -> None:
        assert classify(claim(opt_in=True), waited_for=False) is Action.ALLOCATE
        assert classify(claim(opt_in=True), waited_for=True) is Action.ALLOCATE
        other = claim(annotations={ALLOCATE_ANNOTATION: "scheduler"})
        assert classify(other, waited_for=False) is Action.IGNORE

    def test_opt_in_on_generated_claim_only_explains(self) -> None:
        c = claim(opt_in=True, annotations={POD_CLAIM_NAME_ANNOTATION: "gpu"})
        assert classify(c, waited_for=True) is Action.EXPLAIN
        c = claim(opt_in=True)
        c["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "1",
                                             "controller": True}]
        assert classify(c, waited_for=False) is Action.EXPLAIN

    def test_stale_explanation_is_cleared_when_nobody_waits(self) -> None:
        c = claim(annotations={HASH_ANNOTATION: "abc"})
        assert classify(c, waited_for=False) is Action.CLEAR

    def test_deletion(self) -> None:
        c = claim(opt_in=True)
        c["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        assert classify(c, waited_for=False) is Action.IGNORE  # no finalizer
        c["metadata"]["finalizers"] = [FINALIZER]
        assert classify(c, waited_for=False) is Action.FINALIZE
        c["status"] = {**allocated_status(["gpu-0"]), "reservedFor": [{"resource": "pods", "name": "p", "uid": "1"}]}
        assert classify(c, waited_for=True) is Action.IGNORE  # in use: not ours to release
        plain = claim()
        plain["metadata"].update(deletionTimestamp="x", finalizers=[FINALIZER])
        assert classify(plain, waited_for=False) is Action.IGNORE  # the scheduler's claim


class TestConfigValidation:
    def test_good_and_foreign_configs_pass(self) -> None:
        foreign = {"opaque": {"driver": "other.example.com", "parameters": {"anything": 1}}}
        assert config_errors([sharing_config(), foreign], DRIVER, "spec.devices.config") == []

    def test_bad_config_names_the_field(self) -> None:
        errs = config_errors([sharing_config(), sharing_config("Bogus")], DRIVER, "spec.devices.config")
        assert len(errs) == 1
        assert errs[0].startswith("spec.devices.config[1].opaque.parameters.sharing.strategy: ")

    def test_nvidia_configs_are_validated_too(self) -> None:
        def nvidia(kind: str, **fields: object) -> dict[str, object]:
            return {"opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, **fields}}}
        good = nvidia("GpuConfig", sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
        assert config_errors([good, nvidia("MigDeviceConfig", sharing={"strategy": "MPS"})], DRIVER, "c") == []
        errs = config_errors([nvidia("GpuConfig", sharing={"strategy": "TimeSlicing", "mpsConfig": {}}),
                              nvidia("VfioDeviceConfig", iommu={"backendPolicy": "LegacyOnly"}),
                              nvidia("GpuConfig", sharing={"strategy": "MPS", "mpsConfig": {"pct": 5}})], DRIVER, "c")
        assert errs[0] == "c[0].opaque.parameters.sharing.mpsConfig: cannot be used with strategy TimeSlicing"
        assert errs[1].startswith("c[1].opaque.parameters.kind: VfioDeviceConfig is NVIDIA's VFIO passthrough")
        assert errs[2].startswith("c[2].opaque.parameters.sharing.mpsConfig.pct: unknown field")

    def test_not_an_object(self) -> None:
        errs = config_errors([{"opaque": {"driver": DRIVER, "parameters": "nope"}}], DRIVER, "p")
        assert errs and errs[0].startswith("p[0].opaque.parameters")
        assert config_errors("nope", DRIVER, "p") == ["p: must be a list"]

    def test_the_field_path_follows_the_parameters(self) -> None:
        errs = config_errors([{"opaque": {"driver": DRIVER, "parameters": {"apiVersion": "v9"}}}], DRIVER, "p")
        assert errs == ["p[0].opaque.parameters.apiVersion: must be 'gpu.dra-driver.io/v1alpha1' or "
                        "'resource.nvidia.com/v1beta1', got 'v9'"]
        errs = config_errors([{"opaque": {"driver": DRIVER, "parameters": "nope"}}], DRIVER, "p")
        assert errs == ["p[0].opaque.parameters: must be an object, got string"]

    def test_a_decoder_bug_is_no_config_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Only a ConfigError is the user's config; anything else the decoder raises (a ValueError
        too) is said as the decoder's failure, by type, and still never crashes the controller."""
        def broken(_parameters: object) -> object:
            raise ValueError("boom")

        monkeypatch.setattr(verdicts, "decode", broken)
        errs = config_errors([sharing_config()], DRIVER, "p")
        assert errs == ["p[0].opaque.parameters: cannot be decoded (ValueError: boom)"]

    def test_per_kind_paths(self) -> None:
        bad = sharing_config("Bogus")
        cls = {"kind": "DeviceClass", **device_class(config=[bad])}
        assert object_config_errors(cls, DRIVER)[0].startswith("spec.config[0].")
        tmpl = {"kind": "ResourceClaimTemplate", "metadata": {"name": "t"},
                "spec": {"spec": {"devices": {"config": [bad]}}}}
        assert object_config_errors(tmpl, DRIVER)[0].startswith("spec.spec.devices.config[0].")

    def test_claim_inherits_class_errors(self) -> None:
        classes = {CLASS: device_class(config=[sharing_config("Bogus")])}
        errs = claim_config_errors(claim(), classes, DRIVER)
        assert errs and errs[0].startswith(f"deviceclass {CLASS}: spec.config[0]")
