"""Makefile and CI tooling: the prerequisites check, every Go tool built from its committed pins, the
Kubernetes binaries the beds run, and the plugin's bytecode compiled as the image ships it."""
