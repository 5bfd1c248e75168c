"""``dra-driver explain NAMESPACE/NAME``: why a ResourceClaim is, could be, or cannot be allocated.

Reads the claim, every ResourceSlice and DeviceClass and every claim's allocation, runs the same
resolution as the controller (other claims' allocations count as used) and prints one of:

* ``allocated``: what and where (from ``status.allocation``);
* ``satisfiable``: which devices on which node the claim would get now;
* ``unsatisfiable``: the engine's explanation.

Opaque configuration of this driver that does not decode is reported too. ``-o json`` prints a
document with the same content. Every failure (bad name, claim not found, cluster unreachable,
no kubeconfig) is one line on stderr and exit status 1; verdicts exit 0.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TextIO

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.allocator.inventory import Inventory
from dra_driver.allocator.resolve import Engine
from dra_driver.controller.reconciler import describe_node_selector
from dra_driver.controller.verdicts import Outcome, Verdict, claim_config_errors, evaluate
from dra_driver.k8s.claims import classes_by_name, is_allocated, reserved_for, status_of, uid_of
from dra_driver.k8s.client import CLAIMS, DEVICE_CLASSES, SLICES, ApiError, ConfigurationError, KubeApi, Obj, RestKubeApi, meta
from dra_driver.k8s.names import parse_namespaced_name


class ExplainError(Exception):
    """A problem the user can act on; printed as one line."""


def parse_claim_ref(text: str) -> tuple[str, str]:
    try:
        return parse_namespaced_name(text, "claim")
    except ValueError as exc:
        raise ExplainError(str(exc)) from None


def device_nodes(slices: list[Obj]) -> dict[tuple[str, str, str], str]:
    """``(driver, pool, device)`` -> node name, for node-local slices and per-device nodes."""
    out: dict[tuple[str, str, str], str] = {}
    for s in slices:
        spec = s.get("spec")
        if not isinstance(spec, Mapping):
            continue
        pool = spec.get("pool")
        pool_name = str(pool.get("name", "")) if isinstance(pool, Mapping) else ""
        driver = str(spec.get("driver", ""))
        slice_node = spec.get("nodeName")
        for d in spec.get("devices") or []:
            if not isinstance(d, Mapping):
                continue
            node = d.get("nodeName") or slice_node
            if node:
                out[(driver, pool_name, str(d.get("name", "")))] = str(node)
    return out


def results_table(allocation: Mapping[str, Any] | None, nodes: Mapping[tuple[str, str, str], str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    for r in (devices.get("results") if isinstance(devices, Mapping) else None) or []:
        if not isinstance(r, Mapping):
            continue
        ident = (str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
        row: dict[str, Any] = {
            "request": r.get("request", ""),
            "driver": ident[0],
            "pool": ident[1],
            "device": ident[2],
            "node": nodes.get(ident),
        }
        if r.get("adminAccess"):
            row["adminAccess"] = True
        if r.get("shareID"):
            row["shareID"] = r["shareID"]
        rows.append(row)
    return rows


def build_report(
    claim: Obj,
    slices: list[Obj],
    classes: list[Obj],
    claims: list[Obj],
    *,
    engine: Engine,
    driver: str = DEFAULT_DRIVER_NAME,
    inventory: Future[Inventory] | None = None,
) -> dict[str, Any]:
    """The JSON document ``explain`` prints (the text form renders the same data).

    ``inventory``, when given, is ``engine.build_inventory(slices)`` already started (or failed).
    """
    m = meta(claim)
    nodes = device_nodes(slices)
    class_map = classes_by_name(classes)
    report: dict[str, Any] = {
        "claim": f"{m.get('namespace')}/{m.get('name')}",
        "uid": uid_of(claim),
    }
    if is_allocated(claim):
        allocation = status_of(claim).get("allocation")
        report.update(
            state="allocated",
            where=describe_node_selector(allocation),
            results=results_table(allocation, nodes),
            reservedFor=[
                f"{r.get('resource', '')}/{r.get('name', '')}" for r in reserved_for(claim) if isinstance(r, Mapping)
            ],
        )
        errors = claim_config_errors(claim, class_map, driver)
        if errors:
            report["configErrors"] = errors
        return report
    try:
        inv = inventory.result() if inventory is not None else engine.build_inventory(slices)
        allocated = engine.allocated_state(claims, exclude_uid=uid_of(claim))
    except Exception as exc:
        outcome = Outcome(Verdict.ERROR, f"cannot build the device inventory: {exc}", text=str(exc))
    else:
        outcome = evaluate(engine, claim, inv, class_map, allocated, driver=driver)
    report["summary"] = outcome.summary
    if outcome.config_errors:
        report["configErrors"] = list(outcome.config_errors)
    if outcome.verdict is Verdict.SATISFIABLE:
        report.update(
            state="satisfiable",
            where=describe_node_selector(outcome.allocation),
            results=results_table(outcome.allocation, nodes),
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
        lines.append(f"{head}, on {report.get('where')}:")
        for r in report.get("results") or []:
            extra = " (admin access)" if r.get("adminAccess") else ""
            node = f" on node {r['node']}" if r.get("node") else ""
            lines.append(f"  request {r['request']}: {r['driver']}/{r['pool']}/{r['device']}{node}{extra}")
        if state == "allocated":
            users = report.get("reservedFor") or []
            lines.append(f"reserved for: {', '.join(users)}" if users else "reserved for: nobody yet")
    elif state == "error":
        lines.append(f"cannot evaluate: {report.get('summary')}")
    else:
        label = "invalid configuration" if state == "invalid-config" else "unsatisfiable"
        lines.append(f"{label}: {report.get('summary')}")
        text = str(report.get("text") or "").rstrip()
        if text and text != report.get("summary"):
            lines.append("")
            lines.append(text)
    errors = report.get("configErrors") or []
    if errors:
        lines.append("")
        lines.append("invalid driver configuration:")
        lines += [f"  {e}" for e in errors]
    return "\n".join(lines)


class _Reads:
    """The reads ``explain`` needs: all claims' allocations in the background, the rest in order here.

    Listing the claims is the longest read even in protobuf (:mod:`dra_driver.k8s.wire`), and most
    of its time is the API server's, so it overlaps with the other reads and with building the
    inventory.  One
    extra connection, not one per read: on a small machine the TLS handshakes and the parallel
    JSON decoding cost more than further overlap gains.  The claim is read on its own, not picked
    from the list, so that a missing claim is a 404 like everywhere else.
    """

    def __init__(self, api: KubeApi, namespace: str, name: str) -> None:
        self.api, self.namespace, self.name = api, namespace, name
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="explain-claims")
        self.claims: Future[list[Obj]] = self._pool.submit(lambda: api.list_claim_allocations().items)

    def claim(self) -> Obj:
        try:
            return self.api.get(CLAIMS, self.name, namespace=self.namespace)
        except ApiError as exc:
            if exc.not_found:
                raise ExplainError(f"ResourceClaim {self.namespace}/{self.name} not found") from None
            raise

    def close(self) -> None:
        # After an error the claims read is not waited for; it ends with its request timeout.
        self._pool.shutdown(wait=False, cancel_futures=True)


def fetch(api: KubeApi, namespace: str, name: str) -> tuple[Obj, list[Obj], list[Obj], list[Obj]]:
    """The claim, every ResourceSlice and DeviceClass, and every claim's allocation (overlapping)."""
    reads = _Reads(api, namespace, name)
    try:
        claim = reads.claim()
        slices = api.list(SLICES, cached=True).items
        classes = api.list(DEVICE_CLASSES, cached=True).items
        return claim, slices, classes, reads.claims.result()
    finally:
        reads.close()


def explain_claim(api: KubeApi, namespace: str, name: str, *, engine: Engine,
                  driver: str = DEFAULT_DRIVER_NAME) -> dict[str, Any]:
    """:func:`fetch` and :func:`build_report`, with the inventory built while the claims list is
    still on its way (not at all for an allocated claim, whose report needs none)."""
    reads = _Reads(api, namespace, name)
    try:
        claim = reads.claim()
        slices = api.list(SLICES, cached=True).items
        classes = api.list(DEVICE_CLASSES, cached=True).items
        inventory: Future[Inventory] | None = None
        if not is_allocated(claim):
            inventory = Future()
            try:
                inventory.set_result(engine.build_inventory(slices))
            except Exception as exc:  # build_report reports it like its own failure
                inventory.set_exception(exc)
        return build_report(claim, slices, classes, reads.claims.result(), engine=engine, driver=driver,
                            inventory=inventory)
    finally:
        reads.close()


def main(
    claim: str,
    kubeconfig: str | None = None,
    output: str = "text",
    *,
    api: KubeApi | None = None,
    engine: Engine | None = None,
    driver: str = DEFAULT_DRIVER_NAME,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    stdout = out or sys.stdout
    stderr = err or sys.stderr
    owned: RestKubeApi | None = None
    try:
        if output not in ("text", "json"):
            raise ExplainError(f"output must be text or json, got {output!r}")
        namespace, name = parse_claim_ref(claim)
        if api is None:
            owned = RestKubeApi.from_kubeconfig(kubeconfig, request_timeout=15.0)
            api = owned
        report = explain_claim(api, namespace, name, engine=engine or Engine(), driver=driver)
    except ExplainError as exc:
        print(f"dra-driver explain: {exc}", file=stderr)
        return 1
    except ConfigurationError as exc:
        print(f"dra-driver explain: {exc}", file=stderr)
        return 1
    except ApiError as exc:
        if exc.status == 0:
            print(f"dra-driver explain: cannot reach the cluster: {exc.message or exc.reason}", file=stderr)
        elif exc.status in (401, 403):
            print(f"dra-driver explain: not allowed: {exc}", file=stderr)
        else:
            print(f"dra-driver explain: API error: {exc}", file=stderr)
        return 1
    except Exception as exc:  # never a traceback for a user
        print(f"dra-driver explain: unexpected error: {type(exc).__name__}: {exc}", file=stderr)
        return 1
    finally:
        if owned is not None:
            owned.close()
    if output == "json":
        print(json.dumps(report, indent=2, sort_keys=True, default=str), file=stdout)
    else:
        print(render_text(report), file=stdout)
    return 0
