"""Instance hosts are IP addresses or RFC 1123 DNS names, and the default label is different
for every endpoint (host and port), so two registrations never share a label by accident."""

from __future__ import annotations

import itertools

import pytest

from sentinel.errors import DecodeError, ValidationError
from sentinel.registry.layout import (
    NAME_MAX_LENGTH,
    default_label,
    host_key,
    validate_host,
    validate_name,
)
from sentinel.registry.records import InstanceRecord, encode

LONG = "x" * 63 + "." + "y" * 63  # 127 characters: a label from it is over 128
VALID = [
    "db-1.example.com",
    "localhost",
    "a",
    "A-1.b2.C3",
    "xn--bcher-kva.example",
    "10.0.0.1",
    "255.255.255.255",
    "::1",
    "::",
    "fe80::1%eth0",
    "[fe80::1%eth0]",
    "[2001:db8::1]",
    "::ffff:10.0.0.1",
    "2001:0db8:0000:0000:0000:0000:0000:0001",
    "1" * 63 + ".example",
    LONG,
    ".".join(["a" * 63] * 3) + "." + "b" * 61,  # 253 characters
]
INVALID = [
    "..",
    "::::",
    "%",
    "[",
    "]",
    "[]",
    "",
    ".",
    "a..b",
    "example.com.",
    ".example.com",
    "-db.example",
    "db-.example",
    "a" * 64 + ".example",
    ".".join(["a" * 63] * 4),  # 255 characters
    "under_score.example",
    "sp ace",
    "tab\t",
    "slash/x",
    "é.example",
    "999.1.1.1",
    "1.2.3",
    "1.2.3.4.5",
    "01.2.3.4",
    "example.123",
    "fe80::1%",
    "fe80::1%eth0/64",
    "fe80::1%eth 0",
    "10.0.0.1%eth0",
    "[10.0.0.1]",
    "[::1",
    "::1]",
    "::g",
    "1:2:3:4:5:6:7:8:9",
    "%eth0",
]


@pytest.mark.parametrize("host", VALID)
def test_ip_addresses_and_rfc_1123_names_are_hosts(host):
    assert validate_host(host) == host
    assert InstanceRecord("api", "p1", "a", host, 80).host == host


@pytest.mark.parametrize("host", INVALID)
def test_anything_else_is_refused_with_a_validation_error(host):
    with pytest.raises(ValidationError, match="must be an IPv4 or IPv6 address or a DNS name"):
        InstanceRecord("api", "p1", "a", host, 80)
    with pytest.raises(ValidationError):
        default_label(host, 80)


@pytest.mark.parametrize("host", [None, 80, b"db", ["db"]])
def test_a_host_that_is_not_a_string_is_refused(host):
    with pytest.raises(ValidationError, match="host must be a string"):
        InstanceRecord("api", "p1", "a", host, 80)


@pytest.mark.parametrize("host", ["..", "%", "[", "::::", "under_score"])
def test_a_stored_instance_with_a_bad_host_is_a_decode_error(host):
    data = encode(
        "/services/api/p1:a",
        {"partition": "p1", "label": "a", "host": host, "port": 80, "scheme": "http"},
    )
    with pytest.raises(DecodeError, match="must be an IPv4 or IPv6 address or a DNS name"):
        InstanceRecord.from_bytes("api", "p1:a", "/services/api/p1:a", data)


def _endpoints() -> list[tuple[str, int]]:
    hosts = [h for h in VALID if not h.startswith("[")] + [
        "fe80::1",
        "fe80::1%eth1",
        "fe80--1",  # a DNS name that looks like an encoded IPv6 address
        "6a",
        "h",
        LONG + ".a",
        LONG + ".b",  # the same first 127 characters as the one before
        LONG + "." + "z" * 63 + "." + "w" * 59 + ".c",  # 253 characters
    ]
    return [(h, p) for h, p in itertools.product(hosts, (1, 80, 8080, 65535))]


def test_the_default_label_is_injective_and_always_a_valid_name():
    labels: dict[str, tuple[str, int]] = {}
    for host, port in _endpoints():
        label = default_label(host, port)
        assert validate_name("label", label) == label and len(label) <= NAME_MAX_LENGTH
        earlier = labels.setdefault(label, (host, port))
        assert (host_key(earlier[0]), earlier[1]) == (host_key(host), port), (label, earlier)
    assert len(labels) == len({(host_key(h), p) for h, p in _endpoints()})


@pytest.mark.parametrize(
    ("host", "port", "label"),
    [
        ("db-1.example.com", 5432, "db-1.example.com_5432"),  # unchanged from before
        ("10.0.0.1", 80, "10.0.0.1_80"),
        ("::1", 8080, "_6_--1_8080"),
        ("[::1]", 8080, "_6_--1_8080"),
        ("0:0::1", 8080, "_6_--1_8080"),
        ("fe80::1%eth0", 80, "_6_fe80--1_eth0_80"),
        ("DB.Example.com", 80, "db.example.com_80"),
    ],
)
def test_default_labels_read_back(host, port, label):
    assert default_label(host, port) == label


def test_one_endpoint_spelt_two_ways_is_one_label():
    assert default_label("::1", 80) == default_label("[0:0:0:0:0:0:0:1]", 80)
    assert default_label("Db.example", 80) == default_label("db.EXAMPLE", 80)
    assert default_label("::1", 80) != default_label("::1", 81)


def test_long_host_names_get_distinct_hashed_labels():
    first, second = default_label(LONG + ".a", 80), default_label(LONG + ".b", 80)
    assert first != second
    assert first.startswith("_h_") and len(first) <= NAME_MAX_LENGTH


@pytest.mark.parametrize(("port", "type_name"), [("80", "str"), (True, "bool"), (80.0, "float")])
def test_a_port_that_is_not_an_int_is_refused(port, type_name):
    with pytest.raises(ValidationError) as info:
        default_label("db-1.example.com", port)
    assert str(info.value) == f"port must be an integer, got {type_name}"


@pytest.mark.parametrize("host", [80, None])
def test_a_host_that_is_not_a_string_is_named_by_its_type(host):
    with pytest.raises(ValidationError) as info:
        validate_host(host)
    assert str(info.value) == f"host must be a string, got {type(host).__name__}"


A63 = "a" * 63


def test_a_label_of_exactly_128_characters_is_kept_as_it_is():
    host = f"{A63}.{'b' * 61}"  # 125 characters: "<host>_80" is 128
    assert default_label(host, 80) == f"{host}_80"
    longer = f"{A63}.{'b' * 62}"  # one more: hashed
    # sha256 of "<longer>_80", first 20 hex digits (sha256sum)
    assert default_label(longer, 80) == f"_h_{longer[:101]}_80_ca5d63a501c28a50e6df"


@pytest.mark.parametrize(
    ("host", "start", "digest"),
    [
        # The cut (101 characters for port 80) ends on a '.': it is dropped.
        (f"{A63}.{'b' * 36}.{'c' * 30}", f"{A63}.{'b' * 36}", "baf2f77eb746f0521dfc"),
        # ... on two '-': both dropped, so the label is a valid name.
        (f"{A63}.{'b' * 35}--{'c' * 20}.{'d' * 10}", f"{A63}.{'b' * 35}", "cf09aebcf5ec85e20cc6"),
    ],
)
def test_a_hashed_label_drops_the_dots_and_hyphens_its_cut_ends_on(host, start, digest):
    # digest: sha256 of "<host>_80", first 20 hex digits (sha256sum)
    assert default_label(host, 80) == f"_h_{start}_80_{digest}"
    assert default_label(host.upper(), 80) == f"_h_{start}_80_{digest}"
