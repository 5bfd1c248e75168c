"""Kubernetes names, checked by the API server's own rules, and ``NAMESPACE/NAME`` references typed
by people, validated before any request.

The rules are those of ``k8s.io/apimachinery/pkg/util/validation`` (``IsDNS1123Label``,
``IsDNS1123Subdomain``, ``IsQualifiedName`` for label keys, ``IsValidLabelValue``, ``IsCIdentifier``)
and of the driver name in ``resource.k8s.io`` (the CSI driver-name rule, which the 1.38 kubelet also
applies at plugin registration): a name this module accepts is one the API server accepts, and the
other way round.

Kept free of the API client so that settings parsing (every command, the liveness probe too)
does not load it.
"""

from __future__ import annotations

import re
from typing import TypeGuard

DNS_LABEL_MAX_LENGTH = 63
DNS_SUBDOMAIN_MAX_LENGTH = 253
DRIVER_NAME_MAX_LENGTH = 63
LABEL_NAME_MAX_LENGTH = 63
LABEL_VALUE_MAX_LENGTH = 63

_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL = re.compile(_LABEL)
_DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_QUALIFIED_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _go_len(value: str) -> int:
    # Go's len() of a string: bytes, not characters.
    return len(value.encode("utf-8", "surrogatepass"))


def _go_lower(value: str) -> str:
    # Go's strings.ToLower maps U+0130 to "i"; Python's str.lower() makes it "i" plus a combining dot.
    return value.replace("\u0130", "i").lower()


def is_dns_label(value: object) -> TypeGuard[str]:
    """A DNS-1123 label: namespaces, device, request and counter names."""
    return isinstance(value, str) and _go_len(value) <= DNS_LABEL_MAX_LENGTH and _DNS_LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: object) -> TypeGuard[str]:
    """A DNS-1123 subdomain: the names of most objects (ResourceClaims, DeviceClasses, ...)."""
    return (isinstance(value, str) and _go_len(value) <= DNS_SUBDOMAIN_MAX_LENGTH
            and _DNS_SUBDOMAIN.fullmatch(value) is not None)


def is_driver_name(value: object) -> TypeGuard[str]:
    """A DRA driver name: at most 63 bytes, and a DNS subdomain once lower-cased (so upper case is
    accepted, as the API server does)."""
    return isinstance(value, str) and 0 < _go_len(value) <= DRIVER_NAME_MAX_LENGTH and is_dns_subdomain(_go_lower(value))


def is_label_name(value: object) -> TypeGuard[str]:
    """A label key (``IsQualifiedName``): ``[prefix/]name``, the prefix a DNS subdomain, the name at
    most 63 characters of alphanumerics, ``-``, ``_`` and ``.``, alphanumeric at both ends. Device
    taint keys and binding conditions follow it."""
    if not isinstance(value, str):
        return False
    parts = value.split("/")
    if len(parts) == 2:
        prefix, name = parts
        if not prefix or not is_dns_subdomain(prefix):
            return False
    elif len(parts) == 1:
        name = parts[0]
    else:
        return False
    return 0 < _go_len(name) <= LABEL_NAME_MAX_LENGTH and _QUALIFIED_PART.fullmatch(name) is not None


def is_label_value(value: object) -> TypeGuard[str]:
    """A label value: empty, or at most 63 characters shaped like a label name's name part."""
    return isinstance(value, str) and (value == "" or (
        _go_len(value) <= LABEL_VALUE_MAX_LENGTH and _QUALIFIED_PART.fullmatch(value) is not None))


def is_c_identifier(value: object) -> TypeGuard[str]:
    """A C identifier (``IsCIdentifier``): the name part of a device attribute or capacity."""
    return isinstance(value, str) and _C_IDENTIFIER.fullmatch(value) is not None


def parse_namespaced_name(text: str, what: str) -> tuple[str, str]:
    """``(namespace, name)`` of ``text``; ValueError naming ``what`` (e.g. "claim") and the bad part."""
    parts = text.split("/")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise ValueError(f"{what} must be NAMESPACE/NAME, got {text!r}")
    ns, name = parts
    if not is_dns_label(ns):
        raise ValueError(f"invalid namespace {ns!r} (must be a DNS label)")
    if not is_dns_subdomain(name):
        raise ValueError(f"invalid {what} name {name!r} (must be a DNS subdomain)")
    return ns, name
