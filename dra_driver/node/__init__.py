"""The node plugin (``dra-driver kubelet-plugin``): discovers GPUs, publishes ResourceSlices and
prepares claims for the kubelet.

Two paths, one folder per step: ``discovery/`` (find the GPUs) -> ``describe/`` (the devices this
node offers) -> ``publish/`` (ResourceSlices, device health); and the kubelet's call,
``kubelet/`` (gRPC servers) -> ``prepare/`` (check, apply config, record, write CDI specs).
``plugin.py`` wires them; imports only go down this order (``[tool.importlinter]`` in pyproject.toml).
"""
