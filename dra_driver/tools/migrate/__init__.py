"""``dra-driver migrate``: the DeviceClasses, workload report and node steps for moving from NVIDIA's device plugin.

Imports go one way (the ``tools.migrate`` contract in ``pyproject.toml``): :mod:`.command` (the
edge: arguments, the cluster's reads and writes, the output) → :mod:`.steps` (each node's steps)
→ :mod:`.workloads` (what each workload asks for and what serves it) → :mod:`.classes` (the
DeviceClasses) → :mod:`.config` (the device plugin's config). Nothing is imported here.
"""
