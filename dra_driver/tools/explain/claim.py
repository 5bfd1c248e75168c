"""``dra-driver explain claim/NAME``: why a ResourceClaim is, could be, or cannot be allocated.

The claim, every ResourceSlice and DeviceClass and every claim's allocation are read, and the same
resolution as the controller's runs (other claims' allocations count as used). The report is one of:

* ``allocated``: what and where (from ``status.allocation``), and what the drivers reported in
  the claim's device status;
* ``satisfiable``: which devices on which node the claim would get now;
* ``unsatisfiable``: the engine's explanation.

A share (a result on a device that allows multiple allocations) says what it consumes and why
(``memory: asked 7Gi → consumes 8Gi (step 8Gi)``). Opaque configuration of this driver that does not
decode is reported too. :mod:`dra_driver.tools.explain.pod` builds a pod's report from these.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar, cast

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.allocator.capacity import rounding_note, show
from dra_driver.allocator.inventory import Inventory, quantity_or_none
from dra_driver.allocator.resolve import Engine
from dra_driver.allocator.rules import SchedulerRules
from dra_driver.allocator.taintrules import taint_rules, with_taint_rules
from dra_driver.controller.verdicts import Outcome, Verdict, claim_config_errors, evaluate
from dra_driver.controller.views import slice_reading
from dra_driver.k8s.bodies import RawBody, RawDeviceClass, RawSlice
from dra_driver.k8s.claims import classes_by_name, is_allocated, reserved_for, status_of, uid_of
from dra_driver.k8s.client import (
    CLAIMS,
    DEVICE_CLASSES,
    DEVICE_TAINT_RULES,
    SLICES,
    ApiError,
    KubeApi,
    ListResult,
    Resource,
)
from dra_driver.k8s.objects import Obj, as_mapping, describe_node_selector, meta
from dra_driver.k8s.wire import Reduced
from dra_driver.tools.explain.drivers import claim_drivers


class ExplainError(Exception):
    """A problem the user can act on; printed as one line."""


class NotFoundError(ExplainError):
    """The pod or claim asked about is not there."""


DeviceId = tuple[str, str, str]


def slice_devices(slices: Sequence[RawSlice]) -> dict[DeviceId, tuple[str | None, Mapping[str, Any]]]:
    """``(driver, pool, device)`` -> (node name for node-local slices and per-device nodes, the device)."""
    out: dict[DeviceId, tuple[str | None, Mapping[str, Any]]] = {}
    for s in slices:
        spec = as_mapping(s.get("spec"))
        pool_name = str(as_mapping(spec.get("pool")).get("name", ""))
        driver = str(spec.get("driver", ""))
        slice_node = spec.get("nodeName")
        for d in spec.get("devices") or []:
            if not isinstance(d, Mapping):
                continue
            node = d.get("nodeName") or slice_node
            out[(driver, pool_name, str(d.get("name", "")))] = (str(node) if node else None, d)
    return out


def _request_capacity(claim: Mapping[str, Any], request: str) -> Mapping[str, Any]:
    """``capacity.requests`` of a claim request (``req`` or ``req/sub``), as written."""
    base, _, sub = request.partition("/")
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    for req in (devices.get("requests") if isinstance(devices, Mapping) else None) or []:
        if not isinstance(req, Mapping) or req.get("name") != base:
            continue
        body = req.get("exactly") if not sub else next(
            (b for b in req.get("firstAvailable") or [] if isinstance(b, Mapping) and b.get("name") == sub), None)
        capacity = body.get("capacity") if isinstance(body, Mapping) else None
        wanted = capacity.get("requests") if isinstance(capacity, Mapping) else None
        return wanted if isinstance(wanted, Mapping) else {}
    return {}


def _consumption(claim: Mapping[str, Any], result: Mapping[str, Any], device: Mapping[str, Any] | None) -> list[str]:
    consumed = result.get("consumedCapacity")
    if not isinstance(consumed, Mapping):
        return []
    asked = _request_capacity(claim, str(result.get("request", "")))
    published = device.get("capacity") if isinstance(device, Mapping) else None
    notes = []
    for name, value in consumed.items():
        q = quantity_or_none(value)
        if q is None:
            notes.append(f"{name}: {value}")
            continue
        entry = published.get(name) if isinstance(published, Mapping) else None
        policy = entry.get("requestPolicy") if isinstance(entry, Mapping) else None
        # 1.38 writes the name as published and accepts it requested either way.
        driver = str(result.get("driver", ""))
        key = str(name)
        spellings = (key, key.removeprefix(f"{driver}/") if "/" in key else f"{driver}/{key}")
        wanted = next((asked[n] for n in spellings if n in asked), None)
        notes.append(rounding_note(str(name), quantity_or_none(wanted), q.value,
                                   policy if isinstance(policy, Mapping) else {}))  # fmt: skip
    return notes


def results_table(claim: Mapping[str, Any], allocation: Mapping[str, Any] | None,
                  devices: Mapping[DeviceId, tuple[str | None, Mapping[str, Any]]]) -> list[dict[str, Any]]:  # fmt: skip
    rows: list[dict[str, Any]] = []
    alloc_devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    for r in (alloc_devices.get("results") if isinstance(alloc_devices, Mapping) else None) or []:
        if not isinstance(r, Mapping):
            continue
        ident = (str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
        node, raw = devices.get(ident, (None, None))
        row: dict[str, Any] = {
            "request": r.get("request", ""),
            "driver": ident[0],
            "pool": ident[1],
            "device": ident[2],
            "node": node,
        }
        if r.get("adminAccess"):
            row["adminAccess"] = True
        if r.get("shareID"):
            row["shareID"] = r["shareID"]
        if isinstance(r.get("consumedCapacity"), Mapping):
            row["consumedCapacity"] = {k: _canonical(v) for k, v in r["consumedCapacity"].items()}
            row["consumption"] = _consumption(claim, r, raw)
        rows.append(row)
    return rows


def _canonical(value: Any) -> str:
    q = quantity_or_none(value)
    return show(q.value) if q is not None else str(value)


def build_report(
    claim: Mapping[str, Any],
    slices: list[RawSlice],
    classes: Sequence[RawDeviceClass],
    claims: Sequence[RawBody],
    *,
    engine: Engine,
    driver: str = DEFAULT_DRIVER_NAME,
    inventory: Future[Inventory] | None = None,
    rules: SchedulerRules | None = None,
) -> dict[str, Any]:
    """The JSON document ``explain`` prints (the text form renders the same data).

    ``inventory``, when given, is ``engine.build_inventory(slices)`` already started (or failed);
    ``rules``: the scheduler version to decide as (the newest the engine knows by default).
    """
    rules = rules or SchedulerRules()
    m = meta(claim)
    nodes = slice_devices(slices)
    class_map = classes_by_name(classes)
    report: dict[str, Any] = {
        "claim": f"{m.get('namespace')}/{m.get('name')}",
        "uid": uid_of(claim),
        "rules": rules.label,
    }
    if is_allocated(claim):
        allocation = status_of(claim).get("allocation")
        report.update(
            state="allocated",
            where=describe_node_selector(allocation),
            results=results_table(claim, allocation, nodes),
            reservedFor=[
                f"{r.get('resource', '')}/{r.get('name', '')}" for r in reserved_for(claim) if isinstance(r, Mapping)
            ],
        )
        statuses = device_status(claim)
        if statuses:
            report["deviceStatus"] = statuses
        errors = claim_config_errors(claim, class_map, driver)
        if errors:
            report["configErrors"] = errors
        return report
    try:
        inv = inventory.result() if inventory is not None else engine.build_inventory(slices)
        allocated = engine.allocated_state(claims, exclude_uid=uid_of(claim))
    except Exception as exc:  # last resort: an inventory the engine cannot build is this claim's error verdict
        outcome = Outcome(verdict=Verdict.ERROR, summary=f"cannot build the device inventory: {exc}", text=str(exc))
    else:
        outcome = evaluate(engine, claim, inv, class_map, allocated, driver=driver, rules=rules)
    report["summary"] = outcome.summary
    if outcome.config_errors:
        report["configErrors"] = list(outcome.config_errors)
    if outcome.verdict is Verdict.SATISFIABLE:
        report.update(
            state="satisfiable",
            where=describe_node_selector(outcome.allocation),
            results=results_table(claim, outcome.allocation, nodes),
        )
    elif outcome.verdict is Verdict.INVALID_CONFIG:
        report.update(state="invalid-config", explanation=outcome.explanation, text=outcome.text)
    elif outcome.verdict is Verdict.ERROR:
        report.update(state="error", text=outcome.text)
    else:
        report.update(state="unsatisfiable", explanation=outcome.explanation, text=outcome.text)
    return report


def render_text(report: Mapping[str, Any]) -> str:
    lines = [f"ResourceClaim {report['claim']} (uid {report.get('uid') or '?'})"]
    state = report.get("state")
    if state in ("allocated", "satisfiable"):
        head = "allocated" if state == "allocated" else "not allocated; would be satisfiable now"
        results = report.get("results") or []
        lines.append(f"{head}, on {report.get('where')}: {_device_count(results)}")
        for r in results:
            extra = " (admin access)" if r.get("adminAccess") else ""
            node = f" on node {r['node']}" if r.get("node") else ""
            share = "; ".join((["share"] if r.get("shareID") else []) + list(r.get("consumption") or []))
            extra += f" ({share})" if share else ""
            lines.append(f"  request {r['request']}: {r['driver']}/{r['pool']}/{r['device']}{node}{extra}")
        if state == "allocated":
            users = report.get("reservedFor") or []
            lines.append(f"reserved for: {', '.join(users)}" if users else "reserved for: nobody yet")
            lines += device_status_lines(report.get("deviceStatus") or [])
    elif state == "error":
        lines.append(f"cannot evaluate: {report.get('summary')}")
    else:
        label = "invalid configuration" if state == "invalid-config" else "unsatisfiable"
        lines.append(f"{label}: {report.get('summary')}")
        text = str(report.get("text") or "").rstrip()
        if text and text != report.get("summary"):
            lines.append("")
            lines.append(text)
    if report.get("rules"):
        lines.append("")
        lines.append(f"rules: {report['rules']}")
    if report.get("rulesWarning"):
        lines.append(f"warning: {report['rulesWarning']}")
    errors = report.get("configErrors") or []
    if errors:
        lines.append("")
        lines.append("invalid driver configuration:")
        lines += [f"  {e}" for e in errors]
    return "\n".join(lines)


def device_status(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``status.devices`` as the drivers wrote it (every driver's): per device its conditions and data."""
    out = []
    for d in status_of(claim).get("devices") or []:
        if not isinstance(d, Mapping):
            continue
        conditions = [c for c in d.get("conditions") or [] if isinstance(c, Mapping)]
        entry: dict[str, Any] = {
            "device": f"{d.get('driver')}/{d.get('pool')}/{d.get('device')}",
            "conditions": [f"{c.get('type')}={c.get('status')}" + (f" ({c['reason']})" if c.get("reason") else "")
                           for c in conditions],
            "data": d.get("data") if isinstance(d.get("data"), Mapping) else {},
        }
        if d.get("shareID"):
            entry["shareID"] = d["shareID"]
        out.append(entry)
    return out


def device_status_lines(statuses: list[Mapping[str, Any]]) -> list[str]:
    if not statuses:
        return []
    lines = ["device status (written by the drivers):"]
    for st in statuses:
        share = f" share {st['shareID']}" if st.get("shareID") else ""
        said = ", ".join(st.get("conditions") or []) or "no conditions"
        data = ", ".join(f"{k}={v}" for k, v in (st.get("data") or {}).items())
        lines.append(f"  {st['device']}{share}: {said}" + (f"; {data}" if data else ""))
    return lines


def _device_count(results: list[Mapping[str, Any]]) -> str:
    """``3 device(s)``, shares counted apart: ``2 device(s), 3 share(s) on 2 of them``."""
    devices = Counter(f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}" for r in results)
    shared = Counter(f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}" for r in results if r.get("shareID"))
    text = f"{len(devices)} device(s)"
    if shared:
        text += f", {sum(shared.values())} share(s) on {len(shared)} of them"
    return text


class _Reads:
    """The reads ``explain`` needs: the ResourceSlices (with the DeviceTaintRules) in the background,
    the rest in order here.

    The slices are the longest read: the API server's encoding of every device and our decoding of
    it (:mod:`dra_driver.k8s.wire`, in protobuf). The claim, the classes and every claim's
    allocation are read here meanwhile, while the server works on them. One extra connection, not
    one per read: on a small machine the TLS handshakes and the parallel decoding cost more than
    further overlap gains. The claim is read on its own, not picked from the list, so that a
    missing claim is a 404 like everywhere else. An error is raised where its read used to be
    when they were read one after another: the claim's, the slices', the classes', the claims'.
    """

    def __init__(self, api: KubeApi, namespace: str, name: str) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="explain-slices")
        self.slices: Future[list[RawSlice]] = self._pool.submit(tainted_slices, api)

    def claim(self) -> Obj:
        try:
            return self.api.get(CLAIMS, self.name, namespace=self.namespace)
        except ApiError as exc:
            if exc.not_found:
                raise NotFoundError(f"ResourceClaim {self.namespace}/{self.name} not found") from None
            raise

    def inventory(self, engine: Engine) -> Future[Inventory]:
        """The engine's inventory of the slices, built in the background once they are read."""
        return self._pool.submit(lambda: engine.build_inventory(self.slices.result()))

    def rest(self) -> tuple[Future[Sequence[RawDeviceClass]], Future[list[RawBody]]]:
        """The classes and every claim's allocation, read now; their errors are raised by
        ``result()``, after the slices' (:attr:`slices`)."""
        return read_now(lambda: self.api.list(DEVICE_CLASSES, cached=True).items), \
            read_now(lambda: self.api.list_claim_allocations().items)

    def close(self) -> None:
        # After an error the slices read is not waited for; it ends with its request timeout.
        self._pool.shutdown(wait=False, cancel_futures=True)


_T = TypeVar("_T")


def read_now(read: Callable[[], _T]) -> Future[_T]:
    """``read()``, run here and now; its result, or its error, kept for when it is asked for."""
    done: Future[_T] = Future()
    try:
        done.set_result(read())
    except Exception as exc:  # raised where the result is asked for
        done.set_exception(exc)
    return done


class ListsObjects(Protocol):
    """The one read :func:`tainted_slices` makes: the API client has it, and so has the fleet
    commands' client that can only read (:class:`dra_driver.tools.fleet.reads.ReadOnly`)."""

    def list(self, res: Resource, *, cached: bool = False, reduced: Reduced[Any] | None = None) -> ListResult: ...


def tainted_slices(api: ListsObjects) -> list[RawSlice]:
    """Every ResourceSlice, with the taints of the DeviceTaintRules merged into the devices they
    select, as the scheduler sees them. A server that does not serve the rules (before 1.37), or a
    caller who may not read them, has none."""
    slices = cast(list[RawSlice], api.list(SLICES, cached=True, reduced=slice_reading()).items)
    try:
        rules = api.list(DEVICE_TAINT_RULES, cached=True).items
    except ApiError as exc:
        if not (exc.forbidden or exc.not_found):
            raise
        return slices
    return [cast(RawSlice, dict(s)) for s in with_taint_rules(slices, taint_rules(rules))]


def fetch(api: KubeApi, namespace: str, name: str) -> tuple[Obj, list[RawSlice], Sequence[RawDeviceClass], list[RawBody]]:
    """The claim, every ResourceSlice and DeviceClass, and every claim's allocation (overlapping)."""
    reads = _Reads(api, namespace, name)
    try:
        claim = reads.claim()
        classes, allocations = reads.rest()
        slices = reads.slices.result()
        return claim, slices, classes.result(), allocations.result()
    finally:
        reads.close()


def explain_claim(api: KubeApi, namespace: str, name: str, *, engine: Engine,
                  driver: str = DEFAULT_DRIVER_NAME,
                  rules: SchedulerRules | Callable[[], SchedulerRules] | None = None) -> dict[str, Any]:
    """:func:`fetch` and :func:`build_report`, with the inventory built in the background once the
    slices are in, while the classes and claims are read (not at all for an allocated claim, whose
    report needs none). ``rules`` may be a function that decides them (asking the API server's
    version): it is called once the slices are being read, before any other read."""
    reads = _Reads(api, namespace, name)
    try:
        decided = rules() if callable(rules) else rules
        claim = reads.claim()
        # A failed build is in the future; build_report reports it like its own failure.
        inventory = None if is_allocated(claim) else reads.inventory(engine)
        listed, allocations = reads.rest()
        slices = reads.slices.result()
        classes = listed.result()
        drivers = claim_drivers(claim, classes_by_name(classes))
        if drivers and driver not in drivers:
            raise ExplainError(f"ResourceClaim {namespace}/{name} is a claim of {', '.join(sorted(drivers))}, "
                               f"not of {driver}")
        return build_report(claim, slices, classes, allocations.result(), engine=engine, driver=driver,
                            inventory=inventory, rules=decided)
    finally:
        reads.close()
