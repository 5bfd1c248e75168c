"""The fleet commands' output over the offline fixture, saved or compared byte for byte:
``python -m e2e.bench.scale.fleetsame --save DIR`` with one checkout, ``--against DIR`` with another.

Every command of :mod:`e2e.bench.scale.fleetviews` in text, wide and JSON, with the filters and
``--partitions``, on a small fleet with and without dynamic-MIG nodes (``--nodes``, ``--mig-nodes``).
A speed-up of the views must print the same bytes: this is how a change shows it did. A checking
script, not a test (the fixtures take seconds to build; ``unit_tests/tools/fleet`` holds the views'
semantics).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from e2e.bench.scale.fleetviews import COMMANDS, Cluster, run_command

VARIANTS: dict[str, tuple[str, ...]] = {
    **{name: argv for name, argv in COMMANDS.items()},
    **{f"{name} -o {out}": (*argv, "-o", out) for name, argv in COMMANDS.items() for out in ("wide", "json")},
    "get gpus -A --partitions -o json": ("get", "gpus", "-A", "--partitions", "-o", "json"),
    "get gpus -A --partitions -o wide": ("get", "gpus", "-A", "--partitions", "-o", "wide"),
    "get gpus --free": ("get", "gpus", "--free"),
    "get gpus -A --model h100": ("get", "gpus", "-A", "--model", "h100"),
    "get gpus -A --node gpu-node-3": ("get", "gpus", "-A", "--node", "gpu-node-3"),
    "get gpus -A -l": ("get", "gpus", "-A", "-l", "device.attributes['gpu.dra-driver.io'].index < 4"),
    "get nodes -o yaml": ("get", "nodes", "-o", "yaml"),
    "top -o yaml": ("top", "-o", "yaml"),
    "fit --count 3": ("fit", "--template", COMMANDS["fit --count 1000"][2], "--count", "3"),
}


def outputs(nodes: int, mig_nodes: int, claims_per_node: int) -> dict[str, str]:
    cluster = Cluster(nodes, claims_per_node, mig_nodes)
    found = {}
    for name, argv in VARIANTS.items():
        try:
            found[name] = run_command(cluster, argv)
        except RuntimeError as exc:  # an error is an output too: it must stay the same
            found[name] = f"error: {exc}"
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.bench.scale.fleetsame", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--mig-nodes", type=int, nargs="+", default=[0, 30], help="one fleet per number")
    parser.add_argument("--claims-per-node", type=int, default=6)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--save", type=Path, help="write each output there")
    where.add_argument("--against", type=Path, help="compare with the outputs --save wrote there")
    args = parser.parse_args(argv)
    differ = 0
    for mig in args.mig_nodes:
        fleet = f"nodes{args.nodes}-mig{mig}-claims{args.claims_per_node}"
        for name, text in outputs(args.nodes, mig, args.claims_per_node).items():
            path = (args.save or args.against) / fleet / (name.replace(" ", "_").replace("/", "_") + ".out")
            digest = hashlib.sha256(text.encode()).hexdigest()[:12]
            if args.save is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                print(f"{fleet} {name}: {len(text.encode())} bytes {digest}")
                continue
            before = path.read_text() if path.exists() else None
            same = before == text
            differ += not same
            print(f"{fleet} {name}: {'same' if same else 'DIFFERENT'} ({len(text.encode())} bytes {digest})")
            if not same:
                path.with_suffix(".now").write_text(text)
    if args.against is not None:
        print(json.dumps({"different": differ}))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
