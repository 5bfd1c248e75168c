"""Describe: the discovered GPUs as the devices this node offers (names, attributes, capacity)."""
