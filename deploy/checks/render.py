"""Print every deployable manifest as one multi-document YAML stream.

For server-side validation against a real API server, e.g.::

    kubectl create namespace dra-driver
    python deploy/checks/render.py --namespace dra-driver --examples-namespace default \\
        | kubectl apply --dry-run=server -f -

Sections (``--only`` picks some): ``chart`` (``helm template`` of deploy/helm/dra-driver; the
helm binary is built with deploy/checks/helm.py when not cached), ``deviceclasses``
(deploy/deviceclasses/*.yaml) and ``examples`` (deploy/examples/*/*.yaml).

Notes for dry runs:

* The chart's namespaced objects go to ``--namespace``, which must exist.
* The chart and deploy/deviceclasses define the same DeviceClasses; with ``--only`` absent both
  are printed (a dry-run apply of the second just reports "configured").
* The ``admin-access`` example is only admitted in a namespace labelled
  ``resource.kubernetes.io/admin-access: "true"``; it is left out unless
  ``--admin-access-namespace`` names such a namespace.
* Examples are namespace-less; ``--examples-namespace`` stamps a namespace on them (not on
  cluster-scoped kinds such as the device-taint-rule example's ``DeviceTaintRule``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
DEVICECLASS_DIR = REPO_ROOT / "deploy" / "deviceclasses"
EXAMPLES_DIR = REPO_ROOT / "deploy" / "examples"
SECTIONS = ("chart", "deviceclasses", "examples")
ADMIN_ACCESS_EXAMPLE = "admin-access"
CLUSTER_SCOPED_KINDS = {"DeviceClass", "DeviceTaintRule"}


def _load_helm_module() -> Any:
    sys.path.insert(0, str(HERE))
    try:
        import helm as helm_module  # deploy/checks/helm.py
    finally:
        sys.path.pop(0)
    return helm_module


def chart_documents(namespace: str = "dra-driver", values: Sequence[str] = (),
                    release: str = "dra-driver") -> list[dict[str, Any]]:
    """``helm template`` of the chart (extra ``--set`` style args in ``values``)."""
    helm_module = _load_helm_module()
    helm = helm_module.build(log=False)
    args = [str(helm), "template", release, str(helm_module.CHART_DIR), "--namespace", namespace,
            "--kube-version", helm_module.KUBE_VERSION, *values]
    proc = helm_module._run(args)
    if proc.returncode != 0:
        raise SystemExit(f"render: helm template failed:\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _file_documents(paths: Iterable[Path]) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(paths):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path, doc))
    return out


def deviceclass_documents(api_profile: str = "dra-driver") -> list[dict[str, Any]]:
    """The plain DeviceClass manifests: this driver's own, or (``nvidia``) NVIDIA's, in ``nvidia/``."""
    folder = DEVICECLASS_DIR / "nvidia" if api_profile == "nvidia" else DEVICECLASS_DIR
    return [d for _, d in _file_documents(folder.glob("*.yaml"))]


def example_files() -> list[Path]:
    return sorted(EXAMPLES_DIR.glob("*/*.yaml"))


def example_documents(namespace: str | None = None, admin_access_namespace: str | None = None) -> list[dict[str, Any]]:
    docs = []
    for path, doc in _file_documents(example_files()):
        scenario = path.parent.name
        ns = namespace
        if scenario == ADMIN_ACCESS_EXAMPLE:
            if not admin_access_namespace:
                continue
            ns = admin_access_namespace
        if ns and doc.get("kind") not in CLUSTER_SCOPED_KINDS:
            doc.setdefault("metadata", {})["namespace"] = ns
        docs.append(doc)
    return docs


def render(sections: Sequence[str] = SECTIONS, namespace: str = "dra-driver", examples_namespace: str | None = None,
           admin_access_namespace: str | None = None, values: Sequence[str] = ()) -> str:
    docs: list[dict[str, Any]] = []
    if "chart" in sections:
        docs += chart_documents(namespace, values)
    if "deviceclasses" in sections:
        docs += deviceclass_documents()
    if "examples" in sections:
        docs += example_documents(examples_namespace, admin_access_namespace)
    return yaml.safe_dump_all(docs, sort_keys=False, explicit_start=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print chart, DeviceClass and example manifests as one YAML stream.")
    parser.add_argument("--only", action="append", choices=SECTIONS, help="section to print (repeatable; default all)")
    parser.add_argument("--namespace", default="dra-driver", help="release namespace of the chart (default dra-driver)")
    parser.add_argument("--examples-namespace", default=None, help="namespace stamped on the examples (default none)")
    parser.add_argument("--admin-access-namespace", default=None,
                        help="namespace labelled resource.kubernetes.io/admin-access=true for the admin-access example")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="chart value override")
    args = parser.parse_args(argv)
    values = [a for kv in args.set for a in ("--set", kv)]
    sys.stdout.write(render(args.only or SECTIONS, args.namespace, args.examples_namespace,
                            args.admin_access_namespace, values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
