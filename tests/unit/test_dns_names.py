"""The agent's DNS names and records on values alone: the name forms and their encoding of
what DNS cannot hold, the SRV weights, the rotation, and ``--dns``'s addresses."""

from __future__ import annotations

import dataclasses

import dns.name
import dns.rdatatype
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.agent.dns.answers import SRV_WEIGHT_SCALE, Served, records, rotated
from sentinel.agent.dns.names import (
    ENCODED,
    NameTooLong,
    Question,
    encode,
    name_of,
    parse,
    zone_name,
)
from sentinel.agent.dns.server import parse_address
from sentinel.errors import ValidationError
from tests.unit.endpoints import endpoint

ZONE = zone_name("sentinel")
# Sentinel's names: ASCII letters, digits, '.', '_', '-', not starting with '.' or '-'.
NAMES = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}", fullmatch=True)


def labels(name: dns.name.Name) -> list[str]:
    """What the server parses: the labels below the zone, lower case (DNS is
    case-insensitive, and resolvers randomise the case of what they ask: 0x20)."""
    return [label.decode().lower() for label in name.relativize(ZONE).labels]


def test_the_forms_of_the_contract():
    """The names the haproxy helper's configuration and docs/dns.md rely on."""
    assert name_of(Question("orders"), ZONE).to_text() == "orders.sentinel."
    assert name_of(Question("orders", srv=True), ZONE).to_text() == "_orders._tcp.sentinel."
    assert name_of(Question("orders", partition="p1"), ZONE).to_text() == "p1.orders.sentinel."
    assert (
        name_of(Question("orders", partition="p1", srv=True), ZONE).to_text()
        == "_p1._orders._tcp.sentinel."
    )
    assert name_of(Question("orders", key="acme"), ZONE).to_text() == "acme.key.orders.sentinel."
    instance = Question("orders", partition="default", label="a")
    assert name_of(instance, ZONE).to_text() == "a.default.instance.orders.sentinel."
    assert name_of(Question("Orders.V2"), ZONE).to_text() == "x--j5zgizlsomxfmmq.sentinel."


@settings(max_examples=60)  # each a name of up to 128 characters: a few hundred ms in all
@given(service=NAMES, partition=st.none() | NAMES, srv=st.booleans())
def test_every_service_and_partition_name_round_trips_whatever_its_case(service, partition, srv):
    question = Question(service, partition=partition, srv=srv)
    try:
        name = name_of(question, ZONE)
    except NameTooLong:
        assert partition is not None  # a service alone always fits
        return
    assert parse(labels(name)) == question
    assert parse(labels(dns.name.from_text(name.to_text().upper()))) == question


@settings(max_examples=60)
@given(key=st.text(min_size=1, max_size=60), service=NAMES)
def test_any_key_round_trips(key, service):
    question = Question(service, key=key)
    try:
        name = name_of(question, ZONE)
    except NameTooLong:
        assert len(key.encode()) + len(service) > 60
        return
    assert parse(labels(name)) == question


def test_a_name_dns_could_not_hold_as_it_is_is_encoded_and_plain_ones_are_not():
    assert encode("orders-db") == ["orders-db"]
    for name in ("Orders", "orders.v2", "_orders", "x--orders", "a" * 64):
        assert all(label.startswith(ENCODED) for label in encode(name)), name
    # Every label but the last holds 59 base32 characters, the last fewer (an empty one
    # ends a component whose base32 fills its labels): 63 octets with the SRV form's "_".
    for length in range(1, 129):
        chunks = encode("A" * length)
        assert all(len(c) == len(ENCODED) + 59 for c in chunks[:-1]), length
        assert len(chunks[-1]) < len(ENCODED) + 59, length
    assert encode("A" * 147)[-1] == ENCODED  # 236 base32 characters: four full labels


def test_names_that_are_no_form_parse_to_nothing():
    for text in ("a.b.c.d.e", "_orders", "orders._tcp", "x--!!.orders", "x--aaaa", "a.b.c"):
        assert parse(labels(dns.name.from_text(text, ZONE))) is None, text
    # Decoded, but not a Sentinel name (it starts with '.').
    assert parse(encode(".hidden")) is None


def test_srv_weights_keep_their_ratio_after_haproxy_divides_them_by_256():
    instances = tuple(
        dataclasses.replace(endpoint(label, weight=w), host="127.0.0.1", port=port)
        for label, w, port in (("a", 1, 1), ("b", 2, 2), ("c", 5, 3))
    )
    found = records(
        dns.name.from_text("_db._tcp", ZONE), dns.rdatatype.SRV, Served(instances), ZONE, 5, 64, 0
    )
    weights = {r.port: r.weight for r in found.answer[0]}
    assert weights == {1: 13107, 2: 26214, 3: SRV_WEIGHT_SCALE}
    assert [weights[p] // 256 for p in (1, 2, 3)] == [51, 102, 255]  # 1 : 2 : 5
    assert len({r.target for r in found.answer[0]}) == 3
    assert {rrset.name for rrset in found.additional} == {r.target for r in found.answer[0]}


def test_a_records_list_an_address_once_rotate_and_stop_at_the_limit():
    instances = tuple(
        dataclasses.replace(endpoint(str(i)), host=f"10.0.0.{i // 2}", port=i) for i in range(6)
    )
    assert rotated(instances, 7, 2) == (instances[1], instances[2])
    found = records(
        dns.name.from_text("db", ZONE), dns.rdatatype.A, Served(instances), ZONE, 5, 64, 0
    )
    assert [r.address for r in found.answer[0]] == ["10.0.0.0", "10.0.0.1", "10.0.0.2"]
    aaaa = records(
        dns.name.from_text("db", ZONE), dns.rdatatype.AAAA, Served(instances), ZONE, 5, 64, 0
    )
    assert aaaa.answer == []


def test_dns_addresses_are_loopback_unless_named_and_never_a_wildcard_unasked():
    assert parse_address("8600") == ("127.0.0.1", 8600)
    assert parse_address("[::1]:53") == ("::1", 53)
    assert parse_address("10.1.2.3:53") == ("10.1.2.3", 53)
    assert parse_address("0.0.0.0:53", wildcard=True) == ("0.0.0.0", 53)
    for address in ("0.0.0.0:53", "[::]:53", "dns.example:53", "127.0.0.1:99999", "x"):
        with pytest.raises(ValidationError):
            parse_address(address)
    with pytest.raises(ValidationError):
        zone_name(".")
