"""An emulated kubelet + CDI container runtime for one simulated node (DRA only).

It talks to the driver under test only through the kubelet gRPC protos in ``api/proto`` and
never imports ``dra_driver``.
"""
