"""What ``dra-driver explain`` is asked about, read the way kubectl reads its arguments.

``pod/NAME`` or ``pod NAME`` (also ``pods``, ``po``), ``claim/NAME`` or ``claim NAME`` (also
``claims``, ``resourceclaim``, ``resourceclaims``, ``resourceclaim.resource.k8s.io``) in the
namespace of ``-n``, else the kubeconfig context's, else ``default``; nothing: every pending claim
of the namespace, or of all of them with ``-A``. ``NAMESPACE/CLAIM`` still names a claim, unless
its first word is a resource type kubectl knows (``deploy/x``) or has a dot (a namespace has
none): those are errors that list the types ``explain`` takes. Pure: nothing here reads the cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
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


POD_WORDS = ("pod", "pods", "po")
CLAIM_WORDS = ("claim", "claims", "resourceclaim", "resourceclaims", "resourceclaim.resource.k8s.io",
               "resourceclaims.resource.k8s.io")
TYPES = ", ".join((*POD_WORDS, *CLAIM_WORDS))
_KUBECTL_TYPE_WORDS = """
    all binding bindings cm configmap configmaps ep endpoints endpointslice endpointslices ev event events
    limits limitrange limitranges ns namespace namespaces no node nodes pvc persistentvolumeclaim
    persistentvolumeclaims pv persistentvolume persistentvolumes podtemplate podtemplates rc
    replicationcontroller replicationcontrollers quota resourcequota resourcequotas secret secrets sa
    serviceaccount serviceaccounts svc service services ds daemonset daemonsets deploy deployment
    deployments rs replicaset replicasets sts statefulset statefulsets cj cronjob cronjobs job jobs hpa
    horizontalpodautoscaler horizontalpodautoscalers ing ingress ingresses ingressclass ingressclasses
    netpol networkpolicy networkpolicies pdb poddisruptionbudget poddisruptionbudgets pc priorityclass
    priorityclasses sc storageclass storageclasses csidriver csidrivers csinode csinodes crd crds
    customresourcedefinition customresourcedefinitions lease leases csr certificatesigningrequest
    certificatesigningrequests cs componentstatus componentstatuses role roles rolebinding rolebindings
    clusterrole clusterroles clusterrolebinding clusterrolebindings deviceclass deviceclasses
    resourceslice resourceslices resourceclaimtemplate resourceclaimtemplates
"""
KUBECTL_TYPES = frozenset(_KUBECTL_TYPE_WORDS.split())
"""Resource types of the built-in API, by kubectl's names and short names: ``deploy/x`` is a
mistake, not claim ``x`` in namespace ``deploy``."""
OUTPUTS = ("text", "json", "yaml", "wide", "name")
"""``explain -o``: kubectl's names for the forms of an answer."""
USAGE = ("name a pod (pod/NAME or pod NAME), a claim (claim/NAME, claim NAME or NAMESPACE/CLAIM), "
         "or nothing to list the pending claims")


@dataclass(frozen=True)
class Target:
    kind: Kind
    namespace: str | None
    name: str = ""
    namespace_form: bool = False
    """Named as ``NAMESPACE/CLAIM``: a claim not found says how the argument was read."""


def unknown_type(word: str, given: str, name: str | None = None) -> TargetError:
    """``name``: where ``word/name`` could have meant a namespace, how to name that claim."""
    hint = f" (claim {name} in namespace {word}: claim/{name} -n {word})" if name and is_dns_label(word) else ""
    return TargetError(f"unknown resource type {word!r} in {given!r}; explain takes {TYPES}{hint}")


def parse_target(words: str | Sequence[str] | None, *, namespace: str | None, all_namespaces: bool,
                 default_namespace: str) -> Target:
    """The words after ``explain`` (``TYPE/NAME``, ``TYPE NAME``, ``NAMESPACE/CLAIM`` or none) with
    kubectl's ``-n`` (``namespace``) and ``-A``; ``default_namespace``: the context's namespace, or
    ``default``."""
    given = [words] if isinstance(words, str) else list(words or ())
    if namespace is not None and not is_dns_label(namespace):
        raise TargetError(f"invalid namespace {namespace!r} (must be a DNS label)")
    if not given:
        if all_namespaces and namespace is not None:
            raise TargetError("-A lists every namespace; leave out -n")
        return Target(Kind.PENDING, None if all_namespaces else namespace or default_namespace)
    text = " ".join(given)
    if all_namespaces:
        raise TargetError(f"-A lists the pending claims of every namespace; it takes no name (got {text!r})")
    if len(given) == 2 and "/" not in text:
        word, name = given
        if word.lower() not in (*POD_WORDS, *CLAIM_WORDS):
            raise unknown_type(word, text)
        return _named(word.lower(), name, namespace or default_namespace, namespace_form=False)
    if len(given) > 2 or (len(given) == 2 and "/" in text):
        raise TargetError(f"one pod or claim at a time: {USAGE}; got {text!r}")
    word, slash, name = text.partition("/")
    if not slash or "/" in name or not word or not name:
        raise TargetError(f"{USAGE}; got {text!r}")
    lowered = word.lower()
    if lowered in POD_WORDS or lowered in CLAIM_WORDS:
        return _named(lowered, name, namespace or default_namespace, namespace_form=False)
    if lowered in KUBECTL_TYPES or "." in word:
        raise unknown_type(word, text, name)
    if not is_dns_label(word):
        raise TargetError(f"invalid namespace {word!r} in {text!r} (must be a DNS label); {USAGE}")
    if namespace is not None and namespace != word:
        raise TargetError(f"{text!r} names namespace {word!r} but -n says {namespace!r}")
    return _named("claim", name, word, namespace_form=True)


def _named(word: str, name: str, namespace: str, *, namespace_form: bool) -> Target:
    kind = Kind.POD if word in POD_WORDS else Kind.CLAIM
    if not is_dns_subdomain(name):
        raise TargetError(f"invalid {kind.value} name {name!r} (must be a DNS subdomain)")
    return Target(kind, namespace, name, namespace_form)
