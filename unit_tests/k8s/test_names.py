"""DNS names as the API server checks them (k8s.io/apimachinery/pkg/util/validation: IsDNS1123Label,
IsDNS1123Subdomain; the CSI driver-name rule that resource.k8s.io uses for drivers).

Each case follows from those rules: a label is ``[a-z0-9]([-a-z0-9]*[a-z0-9])?`` of at most 63 bytes;
a subdomain is labels joined by single dots, at most 253 bytes in all (its labels are not limited
to 63 there); a driver name is at most 63 bytes and a subdomain once lower-cased. Go's regexp ``$``
matches only at the very end, so a trailing newline is never part of a valid name.
"""

from __future__ import annotations

import pytest

from dra_driver.k8s.names import is_dns_label, is_dns_subdomain, is_driver_name, parse_namespaced_name

LABEL_OK = ["a", "0", "abc", "a-b", "a--b", "1a", "a1", "123", "x" * 63]
LABEL_BAD = ["", "-a", "a-", "-", "A", "aB", "a_b", "a.b", "a b", "a\n", "\na", "é", "x" * 64, 7, None]

SUBDOMAIN_OK = ["a", "a.b", "a-b.c-d", "0.1", "example.com", "x" * 100 + ".com", ".".join(["a" * 63] * 4)[:253].rstrip("."),
                "a" * 253]
SUBDOMAIN_BAD = ["", "a..b", ".a", "a.", ".", "-a.b", "a-.b", "a.-b", "a.b-", "A.b", "a_b.c", "a.b\n", "a" * 254,
                 "a." * 126 + "ab", None]


@pytest.mark.parametrize("value", LABEL_OK)
def test_dns_label_accepts(value: str) -> None:
    assert is_dns_label(value)


@pytest.mark.parametrize("value", LABEL_BAD)
def test_dns_label_refuses(value: object) -> None:
    assert not is_dns_label(value)


@pytest.mark.parametrize("value", SUBDOMAIN_OK)
def test_dns_subdomain_accepts(value: str) -> None:
    assert len(value) <= 253
    assert is_dns_subdomain(value)


@pytest.mark.parametrize("value", SUBDOMAIN_BAD)
def test_dns_subdomain_refuses(value: object) -> None:
    assert not is_dns_subdomain(value)


def test_every_label_is_a_subdomain_and_a_dotted_name_is_not_a_label() -> None:
    for value in LABEL_OK:
        assert is_dns_subdomain(value)
    assert is_dns_subdomain("a.b") and not is_dns_label("a.b")


def test_length_limits_are_exact() -> None:
    assert is_dns_label("a" * 63) and not is_dns_label("a" * 64)
    assert is_dns_subdomain("a" * 253) and not is_dns_subdomain("a" * 254)
    assert is_driver_name("a" * 63) and not is_driver_name("a" * 64)
    dotted = ("a" * 61 + ".") * 4 + "a"  # 249 bytes, labels of 61
    assert is_dns_subdomain(dotted + "bcde") and not is_dns_subdomain(dotted + "bcdef")


@pytest.mark.parametrize("value", ["gpu.example.com", "gpu.dra-driver.io", "a", "GPU.Example.COM", "x" * 63,
                                   "\u212a8s.io",  # KELVIN SIGN: Go lower-cases it to "k"
                                   "\u0130ntel.com"])  # Go lower-cases U+0130 to "i"
def test_driver_name_accepts(value: str) -> None:
    assert is_driver_name(value)


@pytest.mark.parametrize("value", ["", "a..b", ".a", "a.", "-a", "a_b", "gpu.example.com\n", "x" * 64,
                                   "a" * 62 + "\u212a",  # 63 characters, 65 bytes: Go counts bytes
                                   "é.com", None])
def test_driver_name_refuses(value: object) -> None:
    assert not is_driver_name(value)


def test_namespaced_name() -> None:
    assert parse_namespaced_name("ns/claim-1.a", "claim") == ("ns", "claim-1.a")
    for text, message in [("ns/a..b", "invalid claim name 'a..b'"), ("ns/a.", "invalid claim name"),
                          ("Ns/a", "invalid namespace 'Ns'"), ("n.s/a", "invalid namespace"),
                          ("ns/a\n", "invalid claim name"), ("ns", "must be NAMESPACE/NAME"), ("a/b/c", "must be NAMESPACE/NAME"),
                          ("/a", "must be NAMESPACE/NAME")]:
        with pytest.raises(ValueError, match=message):
            parse_namespaced_name(text, "claim")
