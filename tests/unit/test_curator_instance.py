"""Decoding Curator's ServiceInstance JSON: odd but valid nodes map faithfully, and nodes Curator
could not read are a DecodeError naming the node, never a crash."""

from __future__ import annotations

import json

import pytest

from sentinel.errors import DecodeError
from sentinel.registry.curator import CuratorInstance

PATH = "/services/orders/"


def node(**fields: object) -> tuple[str, bytes]:
    document = {"name": "orders", "id": "i-1", "address": "10.0.0.1", "port": 8080, **fields}
    return PATH + str(document["id"]), json.dumps(document).encode()


def decode(**fields: object) -> CuratorInstance:
    return CuratorInstance.from_bytes(*node(**fields))


def uri_spec(*parts: tuple[str, bool]) -> dict:
    return {"parts": [{"value": value, "variable": variable} for value, variable in parts]}


def test_the_example_of_curators_own_documentation_decodes():
    # The ServiceInstance example of curator-x-discovery-server's README: a string payload.
    instance = decode(
        id="ca2fff8e-d756-480c-b59e-8297ff88624b",
        address="10.20.30.40",
        port=1234,
        payload="From Test",
        registrationTimeUTC=1325129459728,
        serviceType="STATIC",
    )
    endpoint = instance.endpoint("test")
    assert (endpoint.host, endpoint.port, endpoint.uri) == (
        "10.20.30.40",
        1234,
        "http://10.20.30.40:1234",
    )
    assert endpoint.properties["payload"] == "From Test"
    assert endpoint.registered_at == 1325129459.728
    assert endpoint.label == "ca2fff8e-d756-480c-b59e-8297ff88624b"


def test_a_disabled_instance_is_down_as_curators_provider_leaves_it_out():
    assert decode(enabled=False).endpoint("orders").status == "down"
    assert decode(enabled=True).endpoint("orders").status == "up"
    assert decode().endpoint("orders").status == "up"  # before CURATOR-275: no field


def test_fields_this_version_does_not_know_are_kept_in_the_properties():
    endpoint = decode(weightHint=3, region={"name": "eu"}).endpoint("orders")
    assert endpoint.properties["curator"]["weightHint"] == 3
    assert endpoint.properties["curator"]["region"] == {"name": "eu"}


def test_a_dubbo_style_id_becomes_a_valid_label_and_stays_known():
    endpoint = decode(id="10.0.0.1:20880").endpoint("orders")
    assert endpoint.label == "10.0.0.1_20880"
    assert endpoint.properties["curator"]["id"] == "10.0.0.1:20880"


def test_the_uri_spec_renders_as_curators_uri_spec_build():
    instance = decode(
        sslPort=8443,
        registrationTimeUTC=5,
        serviceType="PERMANENT",
        uriSpec=uri_spec(
            ("scheme", True),
            ("://", False),
            ("address", True),
            (":", False),
            ("port", True),
            ("/", False),
            ("ssl-port", True),
            ("/", False),
            ("registration-time-utc", True),
            ("/", False),
            ("service-type", True),
            ("/", False),
            ("[", True),
            ("name", True),
            ("]", True),
            ("unknown", True),  # Curator leaves out a variable it does not know
        ),
    )
    assert instance.render_uri() == "https://10.0.0.1:8080/8443/5/permanent/{orders}"
    assert instance.endpoint("orders").uri == instance.render_uri()
    # A null port renders as "" (UriSpec's nullCheck), not "None".
    assert decode(port=None, sslPort=1, uriSpec=uri_spec(("port", True))).render_uri() == ""


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"port": None}, "neither port nor sslPort"),
        ({"port": 0}, "port must be a port number"),
        ({"port": 65536}, "port must be a port number"),
        ({"port": True}, "port must be a port number"),
        ({"sslPort": "443"}, "sslPort must be a port number"),
        ({"address": "not a host!"}, "host"),
        ({"name": ""}, "name must be a non-empty string"),
        ({"serviceType": "EPHEMERAL"}, "serviceType"),
        ({"registrationTimeUTC": -1}, "registrationTimeUTC"),
        ({"enabled": "no"}, "enabled must be true or false"),
        ({"uriSpec": {"parts": "scheme"}}, "uriSpec"),
        ({"uriSpec": {"parts": [{"value": 3}]}}, "uriSpec"),
        ({"uriSpec": {"parts": [{"value": "x", "variable": "yes"}]}}, "variable"),
    ],
)
def test_a_node_curator_could_not_read_is_a_decode_error_naming_it(fields, reason):
    path, data = node(**fields)
    with pytest.raises(DecodeError, match=reason) as refused:
        CuratorInstance.from_bytes(path, data)
    assert refused.value.path == path


@pytest.mark.parametrize(
    "data",
    [None, b"", b"\xff\xfe", b"not json", b"[]", b"[" * 10_000 + b"]" * 10_000, b'{"id": "i-1"}'],
)
def test_garbage_is_a_decode_error_not_a_crash(data):
    with pytest.raises(DecodeError) as refused:
        CuratorInstance.from_bytes(PATH + "i-1", data)
    assert refused.value.path == PATH + "i-1"


def test_a_value_copied_to_another_node_is_refused():
    _, data = node(id="i-1")
    with pytest.raises(DecodeError, match="not the node's name 'i-2'"):
        CuratorInstance.from_bytes(PATH + "i-2", data)
