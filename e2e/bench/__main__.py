"""``python -m e2e.bench [--only NAME ...] [--quick]``: run benchmarks, write results and SUMMARY.md.

Each benchmark writes ``e2e/bench/results/<name>.json``; SUMMARY.md is rebuilt from every result
file present, so a ``--only`` run refreshes one row and keeps the others. The scale bench runs only
when named (``--only scale``, or ``make bench-scale``): it takes its own cluster and half an hour.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path

from e2e.bench.common import BENCH_ORDER, RESULTS, machine_facts, summary_markdown
from e2e.bench.sharedbed import bench_bed
from e2e.tooling import binaries, bytecode

# Benchmarks that need no bed run without starting one.
NEEDS_BED = {"prepare", "mig_publish", "plugin_start", "resolution", "explain", "real_node"}
MODULES = {"prepare": "prepare", "mig_publish": "publish", "plugin_start": "startup", "resolution": "resolution",
           "explain": "explain", "cel": "cel", "real_node": "realnode", "grpc_floor": "floor", "scale": "scale.curve"}
ON_REQUEST = {"scale"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.bench", description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--only", action="append", choices=BENCH_ORDER, help="run only this benchmark (repeatable)")
    parser.add_argument("--quick", action="store_true", help="fewer samples and a smaller scheduler workload")
    parser.add_argument("--results", type=Path, default=RESULTS, help="directory for <name>.json and SUMMARY.md")
    parser.add_argument("--keep", action="store_true", help="keep the bed's directory (logs) afterwards")
    args = parser.parse_args(argv)
    selected = [n for n in BENCH_ORDER if (n in args.only if args.only else n not in ON_REQUEST)]
    failures = 0
    # The plugin is measured as the image ships it (e2e/tooling/bytecode.py); compiled before any
    # timing starts.
    bytecode.shipped_python()
    bed_ctx = bench_bed(keep=args.keep)
    with bed_ctx as bed:
        if any(n in NEEDS_BED for n in selected):
            binaries.ensure()
            t0 = time.monotonic()
            _ = bed.cluster
            print(f"bench: bed up in {time.monotonic() - t0:.1f}s ({bed.workdir})", flush=True)
        machine = machine_facts(bed.workdir)
        for name in selected:
            module = importlib.import_module(f"e2e.bench.{MODULES[name]}")
            print(f"bench: {name} ...", flush=True)
            t0 = time.monotonic()
            try:
                result = module.run(bed, args.quick)
            except Exception:
                traceback.print_exc()
                print(f"bench: {name} FAILED to run", flush=True)
                failures += 1
                continue
            result.parameters["quick"] = args.quick
            path = result.write(machine, args.results)
            verdict = {True: "pass", False: "MISSED", None: "informational"}[result.passed]
            print(f"bench: {name} done in {time.monotonic() - t0:.0f}s: {verdict} -> {path}", flush=True)
            for t in result.targets:
                print(f"    {t['what']}: {t['value']} {t['unit']} ({t['comparison']} {t['limit']}) "
                      f"{'ok' if t['pass'] else 'MISSED'}", flush=True)
    summary = summary_markdown(args.results)
    (args.results / "SUMMARY.md").write_text(summary)
    print(summary)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
