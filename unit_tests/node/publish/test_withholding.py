"""A device the API server would refuse is left out of the node's slices, never the node: by the
checker before any write, and by the API server's own 422 (blamed through its causes, or found by
dry runs) after one."""

from __future__ import annotations

from typing import Any

import pytest
from sliceapi import InMemorySliceApi

from dra_driver.allocator.devicestates import Withheld, withheld_from
from dra_driver.k8s.client import SLICES, ApiError, Resource
from dra_driver.node import events as notices
from dra_driver.node.metrics import METRICS
from dra_driver.node.publish.checker import Violation
from dra_driver.node.publish.publisher import SlicePublisher
from dra_driver.node.publish.slices import split_into_slices
from dra_driver.node.publish.withholding import bisect_refused, refused_devices, withheld_summary

DRIVER = "gpu.example.com"


def dev(name: str, **attributes: Any) -> dict[str, Any]:
    return {"name": name, "attributes": {"type": {"string": "gpu"}, **attributes},
            "capacity": {"memory": {"value": "80Gi"}}}


def published(client: InMemorySliceApi) -> list[str]:
    return [d["name"] for s in client.objects.values() for d in s["spec"].get("devices") or []]


class Refusing(InMemorySliceApi):
    """Refuses (422) every slice holding a device whose ``secret`` attribute is set, as an API server
    with a rule the checker does not know would; ``with_causes`` says whether the refusal names the
    device's index. Records dry runs."""

    def __init__(self, with_causes: bool) -> None:
        super().__init__()
        self.with_causes = with_causes
        self.dry_runs: list[list[str]] = []

    def _refuse(self, body: dict[str, Any]) -> None:
        devices = body["spec"].get("devices") or []
        bad = [i for i, d in enumerate(devices) if "secret" in d["attributes"]]
        if bad:
            causes = [{"field": f"spec.devices[{i}].attributes", "message": "secret attributes are not allowed"}
                      for i in bad] if self.with_causes else [{"field": "spec", "message": "no"}]
            raise ApiError(422, "Invalid", "ResourceSlice is invalid", {"causes": causes})

    def create(self, res: Resource, body: dict[str, Any], *, namespace: str | None = None,
               dry_run: bool = False) -> dict[str, Any]:
        if dry_run:
            self.dry_runs.append([d["name"] for d in body["spec"].get("devices") or []])
            self._refuse(body)
            return body
        self._refuse(body)
        return super().create(res, body, namespace=namespace)

    def replace(self, res: Resource, body: dict[str, Any]) -> dict[str, Any]:
        self._refuse(body)
        return super().replace(res, body)


def test_a_device_the_checker_refuses_is_withheld_and_told_once() -> None:
    client = InMemorySliceApi()
    told: list[tuple[str, str, list[Violation]]] = []
    pub = SlicePublisher(client, DRIVER, "node-a", node_uid="u",
                         on_withheld=lambda d, model, why: told.append((d, model, why)))
    pub.update([dev("gpu-0"), dev("gpu-1", driverVersion={"version": "6.19.14.31400000"},
                                  productName={"string": "NVIDIA H100 80GB HBM3"}), dev("gpu-2")])
    assert pub.degraded() is not None and "gpu-1 (version)" in str(pub.degraded())
    assert METRICS.value("devices_withheld", {"reason": "version"}) == 1
    assert METRICS.value("devices_withheld", {"reason": "one-slash"}) == 0
    assert told == []  # told by the writing instance, when it syncs
    pub.sync()
    assert published(client) == ["gpu-0", "gpu-2"]
    [(name, model, [why])] = told
    assert (name, why.rule, why.field) == ("gpu-1", "version", "attributes[driverVersion].version")
    assert model == "NVIDIA H100 80GB HBM3"
    pub.sync()
    assert len(told) == 1  # once, not every sync
    # Fixed: published again, no longer degraded.
    pub.update([dev("gpu-0"), dev("gpu-1", driverVersion={"version": "6.19.14+31400000"}), dev("gpu-2")])
    pub.sync()
    assert sorted(published(client)) == ["gpu-0", "gpu-1", "gpu-2"]
    assert pub.degraded() is None and pub.withheld == {}
    assert METRICS.value("devices_withheld", {"reason": "version"}) == 0


def test_withheld_devices_stay_in_the_desired_devices_for_health_updates() -> None:
    pub = SlicePublisher(InMemorySliceApi(), DRIVER, "node-a", node_uid="u")
    pub.update([dev("gpu-0"), dev("gpu-1", **{"a/b/c": {"int": 1}})])
    assert [d["name"] for d in pub.devices] == ["gpu-0", "gpu-1"]


def test_a_422_naming_the_device_withholds_it_and_publishes_the_rest() -> None:
    client = Refusing(with_causes=True)
    told: list[str] = []
    pub = SlicePublisher(client, DRIVER, "node-a", node_uid="u", on_withheld=lambda d, _model, why: told.append(d))
    pub.update([dev("gpu-0"), dev("gpu-1", secret={"bool": True}), dev("gpu-2")])
    with pytest.raises(ApiError) as refused:  # this sync fails; the loop retries it with backoff
        pub.sync()
    assert refused.value.status == 422
    assert client.dry_runs == []  # the causes named the device
    assert told == ["gpu-1"] and [v.rule for v in pub.withheld["gpu-1"]] == ["api-server-refused"]
    assert pub.withheld["gpu-1"][0].message == "secret attributes are not allowed"
    pub.sync()
    assert published(client) == ["gpu-0", "gpu-2"]
    assert METRICS.value("devices_withheld", {"reason": "api-server-refused"}) == 1
    # A refusal holds until the device changes; then it is tried again.
    pub.update([dev("gpu-0"), dev("gpu-1"), dev("gpu-2")])
    pub.sync()
    assert sorted(published(client)) == ["gpu-0", "gpu-1", "gpu-2"] and pub.degraded() is None


def test_a_422_without_causes_is_bisected_by_dry_runs() -> None:
    client = Refusing(with_causes=False)
    pub = SlicePublisher(client, DRIVER, "node-a", node_uid="u")
    devices = [dev(f"gpu-{i}") for i in range(8)]
    devices[5] = dev("gpu-5", secret={"bool": True})
    pub.update(devices)
    with pytest.raises(ApiError):
        pub.sync()
    assert list(pub.withheld) == ["gpu-5"]
    assert client.dry_runs[0] == [] and len(client.dry_runs) <= 8 and ["gpu-5"] in client.dry_runs
    pub.sync()
    assert published(client) == [f"gpu-{i}" for i in range(8) if i != 5]


def test_a_422_that_no_device_explains_is_an_error_as_before() -> None:
    class Always(Refusing):
        def _refuse(self, body: dict[str, Any]) -> None:
            raise ApiError(422, "Invalid", "spec.pool is invalid", {"causes": [{"field": "spec.pool.name"}]})

    pub = SlicePublisher(Always(with_causes=False), DRIVER, "node-a", node_uid="u")
    pub.update([dev("gpu-0")])
    with pytest.raises(ApiError):
        pub.sync()
    assert pub.withheld == {}


def test_refused_devices_reads_the_causes() -> None:
    devices = [dev("a"), dev("b")]
    details = {"causes": [{"field": "spec.devices[1].attributes", "message": "bad", "reason": "FieldValueInvalid"},
                          {"field": "spec.devices[7]"}, {"field": "spec.pool"}, "junk"]}
    assert refused_devices(devices, details) == {"b": Violation("b", "api-server-refused", "attributes", "bad")}
    assert refused_devices(devices, {}) == {}


def test_bisect_finds_every_refused_device_with_few_dry_runs() -> None:
    devices = [{"name": str(i)} for i in range(64)]
    asked: list[int] = []

    def accepts(subset: list[dict[str, Any]]) -> bool:
        asked.append(len(subset))
        return not any(d["name"] in ("3", "40") for d in subset)

    assert [d["name"] for d in bisect_refused(devices, accepts)] == ["3", "40"]
    assert len(asked) <= 2 * 2 * 6 + 1
    assert bisect_refused(devices[:3], accepts) == []
    assert bisect_refused([], accepts) == []


def test_list_attributes_halve_the_slice_like_the_api_server() -> None:
    devices = [dev(f"d{i}") for i in range(100)]
    assert len(split_into_slices(devices, [])) == 1
    devices[0]["attributes"]["models"] = {"strings": ["a"]}
    assert [len(s.devices) for s in split_into_slices(devices, [])] == [64, 36]


def test_degraded_summary_and_event() -> None:
    why = [Violation("gpu-1", "one-slash", "attributes[a/b/c]", "must not contain more than one slash")]
    assert withheld_summary({}) is None
    assert withheld_summary({"gpu-1": why}) == (
        "publishing degraded: 1 device(s) withheld from the ResourceSlices because the API server would refuse "
        "them: gpu-1 (one-slash)")
    event = notices.device_withheld("gpu-1", DRIVER, "NVIDIA A100-SXM4-40GB 1g.5gb", why)
    assert (event.type, event.reason) == ("Warning", "DeviceWithheld")
    assert event.note == (f"device gpu-1 of driver {DRIVER} (NVIDIA A100-SXM4-40GB 1g.5gb) is not published, the node's "
                          "other devices are: the API server would refuse it: attributes[a/b/c]: must not contain more "
                          "than one slash (rule one-slash)")
    # What the fleet views and the controller's metric read back, and an Event of a plugin before
    # the driver and the model were in its words.
    earlier = event.note.replace(f" of driver {DRIVER} (NVIDIA A100-SXM4-40GB 1g.5gb)", "")
    read = withheld_from([{"reason": event.reason, "regarding": {"kind": "Node", "name": "node-a"}, "note": note}
                          for note in (event.note, earlier)])
    assert read == [Withheld("node-a", "gpu-1", "attributes[a/b/c]: must not contain more than one slash (rule one-slash)",
                             "unknown", None)]
    (now,) = withheld_from([{"reason": event.reason, "regarding": {"kind": "Node", "name": "node-a"}, "note": event.note}])
    assert (now.model, now.driver, now.of(DRIVER), now.of("gpu.nvidia.com")) == (
        "NVIDIA A100-SXM4-40GB 1g.5gb", DRIVER, True, False)
    # A model is what may be wrong with the device: the note keeps it short and without parentheses.
    odd = notices.device_withheld("gpu-2", DRIVER, "X (" + "y" * 100 + ")", why).note
    (kept,) = withheld_from([{"reason": "DeviceWithheld", "regarding": {"kind": "Node", "name": "n"}, "note": odd}])
    assert kept.model == ("X " + "y" * 100)[:64] and kept.rule.endswith("(rule one-slash)")


def test_dry_run_is_sent_as_a_query() -> None:
    # The REST client passes dryRun=All on create (what bisection relies on).
    from dra_driver.k8s.client import RestKubeApi

    sent: list[Any] = []

    class Probe(RestKubeApi):
        def __init__(self) -> None:
            pass

        def _json(self, method: str, path: str, **kwargs: Any) -> Any:
            sent.append((method, path, kwargs.get("query")))
            return {}

    Probe().create(SLICES, {"metadata": {}}, dry_run=True)
    Probe().create(SLICES, {"metadata": {}})
    assert [q for _, _, q in sent] == [[("dryRun", "All")], None]
