"""The scale bench (``make bench-scale``, ``python -m e2e.bench.scale``): our controller beside the
kube-scheduler on the real control plane at 500 to 5,000 kwok GPU nodes, and the allocator alone at
fleet scale in process.

:mod:`.curve` runs the sizes and writes ``e2e/bench/results/scale.json`` over :mod:`.cluster` (the
control plane, the fleet's slices, the workload, our controller's processes) and :mod:`.rows` (the
arithmetic from measured figures to rows, pure); :mod:`.inprocess` is the allocator alone
(``python -m e2e.bench.scale.inprocess``). Nothing is imported here, so that importing one part
loads only what it needs.
"""
