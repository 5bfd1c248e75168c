"""Kubernetes object references typed by people: ``NAMESPACE/NAME``, validated before any request.

Kept free of the API client so that settings parsing (every command, the liveness probe too)
does not load it.
"""

from __future__ import annotations

import re

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def parse_namespaced_name(text: str, what: str) -> tuple[str, str]:
    """``(namespace, name)`` of ``text``; ValueError naming ``what`` (e.g. "claim") and the bad part."""
    parts = text.split("/")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise ValueError(f"{what} must be NAMESPACE/NAME, got {text!r}")
    ns, name = parts
    if not _DNS_LABEL.match(ns) or len(ns) > 63:
        raise ValueError(f"invalid namespace {ns!r} (must be a DNS label)")
    if not _DNS_SUBDOMAIN.match(name) or len(name) > 253:
        raise ValueError(f"invalid {what} name {name!r} (must be a DNS subdomain)")
    return ns, name
