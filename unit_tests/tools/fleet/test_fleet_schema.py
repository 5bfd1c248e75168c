"""The `-o json` schema the README lists ("Using it") is the one the commands print: every key the
README names is printed, in some case, at its level, and every key printed is named there. Each
optional key is brought out by the case that prints it (pods forbidden, Events forbidden, a
selector failing, an unreadable claim, a shared device, dynamic MIG, the server's version unknown,
a claim that does not fit, a pod's claims)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

from ctrlfix import add_pod, device_class, pod
from fleetfix import dynamic_mig, fleet, template
from kubefake import FakeKube

from dra_driver import cli
from dra_driver.flags import resolve_environment
from dra_driver.k8s.client import CLAIM_TEMPLATES, DEVICE_CLASSES, SLICES, ApiError, ListResult
from dra_driver.tools.fleet import command

README = Path(__file__).resolve().parents[3] / "README.md"
KINDS = {"get gpus": "GpuList", "get nodes": "GpuNodeList", "top": "GpuTop", "fit": "GpuFit"}


def documented() -> dict[str, set[str]]:
    """Per command, the keys the README's list names (the kind's value aside), `rulesWarning` in each."""
    text = README.read_text()
    start = text.index("`-o json` (or `yaml`) prints one document")
    block = text[start:text.index("\n\n", start)]
    head, *bullets = re.split(r"\n- (?=`)", block)
    everywhere = {"rulesWarning"} if "`rulesWarning`? in each" in head else set()
    out: dict[str, set[str]] = {}
    for bullet in bullets:
        name, _, rest = bullet.partition(":")
        words = set(re.findall(r"`([A-Za-z]+)`", rest))
        out[name.strip("`")] = (words - {KINDS[name.strip("`")]}) | everywhere
        assert f"`kind` (`{KINDS[name.strip('`')]}`)" in rest, bullet
    return out


class Unreadable(FakeKube):
    """A cluster with a claim whose version cannot be decoded (left out, and named)."""

    def list_claim_allocations(self) -> ListResult:
        listed = super().list_claim_allocations()

        class Bad:
            ref, reason = "ml/broken", "invalid JSON"

        return ListResult(listed.items, listed.resource_version, [Bad()])  # type: ignore[list-item]


def printed(kube: FakeKube, *argv: str, version: Any = "v1.37.2") -> dict[str, Any]:
    parser = cli.build_parser(cli.KUBECTL_PLUGIN, kubectl_plugin=True)
    args = resolve_environment(parser.parse_args(cli.kubectl_booleans([*argv, "-o", "json"], parser.error)))
    out, err = io.StringIO(), io.StringIO()

    def server_version() -> str:
        if isinstance(version, Exception):
            raise version
        return str(version)

    assert command.main(args, prog="kubectl dra", api=kube, out=out, err=err, server_version=server_version) == 0, err
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def keys(doc: dict[str, Any], *rows: str, nested: tuple[str, ...] = ()) -> set[str]:
    found = set(doc)
    for field in rows:
        for row in doc.get(field) or []:
            found |= set(row)
            for inner in nested:
                for item in row.get(inner) or []:
                    found |= set(item)
    return found


def test_the_readme_lists_exactly_the_keys_the_commands_print() -> None:
    hidden = fleet()
    hidden.fail["list:pods"] = ApiError(403, "Forbidden", "pods is forbidden")
    hidden.fail["list:events"] = ApiError(403, "Forbidden", "events is forbidden")
    broken = Unreadable()
    for obj in fleet().objects.get("resourceslices", {}).values():
        broken.add(SLICES, obj)
    broken.add(DEVICE_CLASSES, device_class())
    gpus = [printed(fleet(), "get", "gpus", "-A", version=RuntimeError("no version")),
            printed(hidden, "get", "gpus", "-A"), printed(dynamic_mig(), "get", "gpus"),
            printed(fleet(), "get", "gpus", "-l", 'device.attributes["x.io"].nope == 1'),
            printed(broken, "get", "gpus")]
    fitting = fleet()
    fitting.add(CLAIM_TEMPLATES, template())
    two = pod("trainer", "", via_template=True)
    two["spec"]["resourceClaims"] = [{"name": "a", "resourceClaimTemplateName": "one-gpu"},
                                     {"name": "b", "resourceClaimTemplateName": "one-gpu"}]
    add_pod(fitting, two)
    fits = [printed(fitting, "fit", "--template", "one-gpu", "--count", "10"),
            printed(fitting, "fit", "pod/trainer", "--count", "3")]
    seen = {
        "get gpus": set().union(*(keys(d, "devices", nested=("holders",)) for d in gpus)),
        "get nodes": keys(printed(fleet(), "get", "nodes", version=RuntimeError("no version")), "nodes"),
        "top": keys(printed(fleet(), "top", version=RuntimeError("no version")), "models", "deviceClasses"),
        "fit": set().union(*(set(d) | set(d.get("firstFailure") or {}) for d in fits))
               | set(printed(fitting, "fit", "--template", "one-gpu", version=RuntimeError("x"))),
    }
    assert {d["kind"] for d in gpus} == {"GpuList"}
    readme = documented()
    assert set(readme) == set(KINDS), sorted(readme)
    for name in KINDS:
        assert readme[name] == seen[name], (name, "README only:", sorted(readme[name] - seen[name]),
                                            "printed only:", sorted(seen[name] - readme[name]))
