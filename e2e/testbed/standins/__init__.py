"""Stand-ins for the NVIDIA driver's command-line tools, written from their documented interfaces
(``nvidia-smi --help``, ``nvidia-smi compute-policy --help``, the MPS documentation), never from
NVIDIA's code. :mod:`e2e.testbed.standins.install` places them in a fake driver root."""
