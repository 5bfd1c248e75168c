"""What ``dra-driver explain`` is asked about, read the way kubectl reads its arguments.

``pod/NAME`` (``pods/``, ``po/``), ``claim/NAME`` (``resourceclaim/``, ``resourceclaims/``,
``resourceclaim.resource.k8s.io/``) in the namespace of ``-n``, else the kubeconfig context's,
else ``default``; ``NAMESPACE/NAME`` of a claim as before; nothing: every pending claim of the
namespace, or of all of them with ``-A``. Pure: nothing here reads the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dra_driver.k8s.names import is_dns_label, is_dns_subdomain


class TargetError(ValueError):
    """An argument that names nothing ``explain`` can look at; the message says what to write."""


class Kind(StrEnum):
    POD = "pod"
    CLAIM = "claim"
    PENDING = "pending"
    """Every pending claim of :attr:`Target.namespace` (all namespaces when it is None)."""


POD_WORDS = frozenset({"pod", "pods", "po"})
CLAIM_WORDS = frozenset({"claim", "claims", "resourceclaim", "resourceclaims", "resourceclaim.resource.k8s.io",
                         "resourceclaims.resource.k8s.io"})
USAGE = "name a pod (pod/NAME), a claim (claim/NAME or NAMESPACE/NAME), or nothing to list the pending claims"


@dataclass(frozen=True)
class Target:
    kind: Kind
    namespace: str | None
    name: str = ""


def parse_target(text: str | None, *, namespace: str | None, all_namespaces: bool, default_namespace: str) -> Target:
    """``text`` with kubectl's ``-n`` (``namespace``) and ``-A``; ``default_namespace``: the
    context's namespace, or ``default``."""
    if namespace is not None and not is_dns_label(namespace):
        raise TargetError(f"invalid namespace {namespace!r} (must be a DNS label)")
    if not text:
        if all_namespaces and namespace is not None:
            raise TargetError("-A lists every namespace; leave out -n")
        return Target(Kind.PENDING, None if all_namespaces else namespace or default_namespace)
    if all_namespaces:
        raise TargetError(f"-A lists the pending claims of every namespace; it takes no name (got {text!r})")
    word, slash, name = text.partition("/")
    if not slash or "/" in name or not word or not name:
        raise TargetError(f"{USAGE}; got {text!r}")
    lowered = word.lower()
    if lowered in POD_WORDS or lowered in CLAIM_WORDS:
        kind = Kind.POD if lowered in POD_WORDS else Kind.CLAIM
        where = namespace or default_namespace
    else:
        kind, where = Kind.CLAIM, word
        if not is_dns_label(where):
            raise TargetError(f"invalid namespace {where!r} in {text!r} (must be a DNS label); {USAGE}")
        if namespace is not None and namespace != where:
            raise TargetError(f"{text!r} names namespace {where!r} but -n says {namespace!r}")
    if not is_dns_subdomain(name):
        raise TargetError(f"invalid {kind.value} name {name!r} (must be a DNS subdomain)")
    return Target(kind, where, name)
