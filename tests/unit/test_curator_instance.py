"""Decoding Curator's ServiceInstance JSON: odd but valid nodes map faithfully, and nodes Curator
could not read are a DecodeError naming the node, never a crash."""

from __future__ import annotations

import json

import pytest

from sentinel.errors import DecodeError, ValidationError
from sentinel.registry.curator import CURATOR_PARTITION, CuratorInstance, decode_endpoint
from sentinel.registry.records import CuratorSource, ServiceSpec

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
    endpoint = instance.endpoint(ServiceSpec("test"))
    assert (endpoint.host, endpoint.port, endpoint.uri) == (
        "10.20.30.40",
        1234,
        "http://10.20.30.40:1234",
    )
    assert endpoint.properties["payload"] == "From Test"
    assert endpoint.registered_at == 1325129459.728
    assert endpoint.label == "ca2fff8e-d756-480c-b59e-8297ff88624b"


def test_a_disabled_instance_is_down_as_curators_provider_leaves_it_out():
    assert decode(enabled=False).endpoint(ServiceSpec("orders")).status == "down"
    assert decode(enabled=True).endpoint(ServiceSpec("orders")).status == "up"
    assert decode().endpoint(ServiceSpec("orders")).status == "up"  # before CURATOR-275: no field


def test_fields_this_version_does_not_know_are_kept_in_the_properties():
    endpoint = decode(weightHint=3, region={"name": "eu"}).endpoint(ServiceSpec("orders"))
    assert endpoint.properties["curator"]["weightHint"] == 3
    assert endpoint.properties["curator"]["region"] == {"name": "eu"}


def test_a_dubbo_style_id_becomes_a_valid_label_and_stays_known():
    endpoint = decode(id="10.0.0.1:20880").endpoint(ServiceSpec("orders"))
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
    assert instance.endpoint(ServiceSpec("orders")).uri == instance.render_uri()
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


# --- a namespace spec naming a Curator registry (CuratorSource) -------------------------------

SHARDED = ServiceSpec("orders", curator=CuratorSource("/services", "payload.metadata.shard"))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (None, "has no partition at payload.metadata.shard"),
        ({"metadata": {"zone": "eu"}}, "has no partition at payload.metadata.shard"),
        ({"metadata": ["shard"]}, "has no partition at payload.metadata.shard"),
        ({"metadata": {"shard": 7}}, "partition"),
        ({"metadata": {"shard": "../p1"}}, "partition"),
        ({"metadata": {"shard": ""}}, "partition"),
    ],
)
def test_an_instance_without_a_partition_where_the_spec_says_is_a_decode_error(payload, reason):
    path, data = node(payload=payload)
    with pytest.raises(DecodeError, match=reason) as caught:
        decode_endpoint(SHARDED, path, data, 0)
    assert caught.value.path == path


def test_the_partition_is_read_from_the_payload_and_the_name_follows_it():
    path, data = node(payload={"@class": "java.util.LinkedHashMap", "metadata": {"shard": "p7"}})
    endpoint = decode_endpoint(SHARDED, path, data, 0)
    assert (endpoint.partition, endpoint.label, endpoint.name) == ("p7", "i-1", "p7:i-1")
    # Without a partition_from every instance is in the one partition, as before.
    unsharded = ServiceSpec("orders", curator=CuratorSource("/services"))
    assert decode_endpoint(unsharded, path, data, 0).partition == CURATOR_PARTITION


@pytest.mark.parametrize(
    ("ports", "scheme", "expected"),
    [
        ({"port": 5432, "sslPort": None}, "http", "http://10.0.0.1:5432"),
        ({"port": 80, "sslPort": 443}, "http", "https://10.0.0.1:443"),  # Curator's rule
        ({"port": 5432, "sslPort": 5433}, "postgresql", "postgresql://10.0.0.1:5432"),
        ({"port": None, "sslPort": 5433}, "postgresql", "postgresql://10.0.0.1:5433"),
    ],
)
def test_a_spec_scheme_other_than_http_is_served_on_the_plain_port(ports, scheme, expected):
    instance = decode(**ports)
    assert instance.endpoint(ServiceSpec("orders", scheme=scheme)).uri == expected


@pytest.mark.parametrize(
    ("base_path", "partition_from"),
    [
        ("services", None),
        ("/services/", None),
        ("/a//b", None),
        (7, None),
        ("/services", ""),
        ("/services", ".metadata"),
        ("/services", "metadata."),
        ("/services", "a..b"),
        ("/services", "a b"),
        ("/services", ".".join(["k"] * 9)),
        ("/services", ["payload"]),
    ],
)
def test_a_curator_source_is_checked_when_made(base_path, partition_from):
    with pytest.raises(ValidationError):
        CuratorSource(base_path, partition_from)


def test_a_spec_with_a_curator_source_round_trips_and_one_without_reads_as_before():
    path = "/services/orders"
    assert ServiceSpec.from_bytes("orders", path, SHARDED.to_bytes(path)) == SHARDED
    plain = ServiceSpec("orders")
    assert "curator" not in json.loads(plain.to_bytes(path))  # what older clients read
    assert ServiceSpec.from_bytes("orders", path, plain.to_bytes(path)).curator is None


@pytest.mark.parametrize(
    "curator",
    [["/services"], {"partition_from": "payload.x"}, {"base_path": "relative"}, "/services"],
)
def test_a_spec_whose_curator_field_is_garbage_is_a_decode_error(curator):
    path = "/services/orders"
    document = {"v": 1, "scheme": "http", "curator": curator}
    with pytest.raises(DecodeError) as caught:
        ServiceSpec.from_bytes("orders", path, json.dumps(document).encode())
    assert caught.value.path == path


# The payloads the JVM frameworks write, as their sources build them (cited in docs/interop.md):
# Spring Cloud Zookeeper's ZookeeperInstance {id, name, metadata} and Dubbo 3's
# org.apache.dubbo.registry.zookeeper.ZookeeperInstance (CuratorFrameworkUtils.build: the node's
# id is "host:port", the payload's id null, its metadata Dubbo's sorted map of strings).
SPRING = {
    "@class": "org.springframework.cloud.zookeeper.discovery.ZookeeperInstance",
    "id": "orders-1",
    "name": "orders",
    "metadata": {"instance_status": "UP", "shard": "p1"},
}
DUBBO = {
    "@class": "org.apache.dubbo.registry.zookeeper.ZookeeperInstance",
    "id": None,
    "name": "orders",
    "metadata": {
        "dubbo.endpoints": '[{"port":20880,"protocol":"dubbo"}]',
        "dubbo.metadata.revision": "2d4c5e6f",
        "dubbo.metadata.storage-type": "local",
        "shard": "p2",
    },
}


@pytest.mark.parametrize(
    ("payload", "instance_id", "partition"),
    [
        (SPRING, "0f6d2c4e-6b1e-4f5a-9a0b-3c2d1e0f9a8b", "p1"),
        (DUBBO, "10.0.0.1:20880", "p2"),
    ],
)
def test_spring_cloud_and_dubbo_payloads_decode_and_give_their_partition(
    payload, instance_id, partition
):
    path, data = node(id=instance_id, payload=payload)
    endpoint = decode_endpoint(
        ServiceSpec("orders", curator=CuratorSource("/services", "payload.metadata.shard")),
        path,
        data,
        0,
    )
    assert endpoint.partition == partition and endpoint.status == "up"
    assert endpoint.properties["payload"] == {k: v for k, v in payload.items() if k != "@class"}
    assert endpoint.properties["curator"]["payloadClass"] == payload["@class"]


@pytest.mark.parametrize(
    ("status", "served"),
    [
        ("UP", True),
        ("up", True),
        ("", True),
        ("  ", True),
        (None, True),
        (7, True),
        ("OUT_OF_SERVICE", False),
        ("DOWN", False),
    ],
)
def test_spring_clouds_instance_status_is_honoured_as_its_load_balancer_does(status, served):
    metadata = {} if status is None else {"instance_status": status}
    endpoint = decode(payload={**SPRING, "metadata": metadata}).endpoint(ServiceSpec("orders"))
    assert endpoint.status == ("up" if served else "down")


def test_every_curator_name_imports_from_sentinel_curator_alone():
    # Issue 39: the Curator names came from three modules; sentinel.curator is the one path.
    import sentinel
    from sentinel import curator
    from sentinel.registry import curator as codecs

    assert set(curator.__all__) == {
        "CuratorPublisher",
        "CuratorRegistration",
        "CuratorSource",
        "SpringPayload",
        "read_instances",
    }
    assert (curator.CuratorSource, curator.read_instances) == (
        CuratorSource,
        codecs.read_instances,
    )
    assert "CuratorSource" not in sentinel.__all__
    assert not hasattr(sentinel, "CuratorSource")
