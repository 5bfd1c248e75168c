"""Benchmarks of the driver on the local bed: ``python -m e2e.bench`` (``make bench``)."""
