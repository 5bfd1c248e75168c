"""What a real GPU machine reports to the driver, and whether a container given the driver's CDI spec
runs CUDA there (docs/nvml.md, "On a real GPU").

    python -m e2e.gpuprobe            # here: assembles .gpuprobe/ (tools, a tiny rootfs, wheels)
    bash e2e/gpuprobe/run.sh          # on the GPU machine, with .gpuprobe/ beside the checkout; writes $OUT

The GPU machine needs Python 3.12 with pynvml, grpcio, protobuf and PyYAML, the NVIDIA driver, and
root (runc). What comes back is a test fixture: ``unit_tests/node/fixtures/h100-real/``.
"""
