"""Endpoint <-> InstanceRecord and Endpoint -> JSON: one conversion each (issue 17)."""

import dataclasses
import json
from types import MappingProxyType

from sentinel.collector.source import instance_environment
from sentinel.registry.endpoint import RECORD_FIELDS, Endpoint
from sentinel.registry.records import InstanceRecord

# A value for every field of InstanceRecord, none of them its default, so a field the
# conversion drops or swaps shows.
RECORD = InstanceRecord(
    service="db",
    partition="p2",
    label="replica-b",
    host="10.0.0.7",
    port=6432,
    scheme="postgresql",
    status="draining",
    weight=2.5,
    zone="eu-1",
    properties={"role": "replica", "tags": ["a"]},
    registered_at=1795317000.5,
)


def test_every_instance_record_field_has_an_endpoint_field_of_the_same_name_and_type():
    """Fails when a field is added to InstanceRecord and Endpoint does not carry it."""
    endpoint_types = {f.name: f.type for f in dataclasses.fields(Endpoint)}
    for field in dataclasses.fields(InstanceRecord):
        assert field.name in endpoint_types, f"Endpoint lacks InstanceRecord.{field.name}"
        assert endpoint_types[field.name] == field.type, field.name
    assert tuple(f.name for f in dataclasses.fields(InstanceRecord)) == RECORD_FIELDS


def test_the_round_trip_keeps_every_field():
    endpoint = Endpoint.from_record(RECORD, joined=42)
    for name in RECORD_FIELDS:
        assert getattr(endpoint, name) == getattr(RECORD, name), name
    assert (endpoint.uri, endpoint.joined) == ("postgresql://10.0.0.7:6432", 42)
    back = endpoint.record()
    # registered_at is compare=False on the record: check it and the rest one by one.
    assert {n: getattr(back, n) for n in RECORD_FIELDS} == {
        n: getattr(RECORD, n) for n in RECORD_FIELDS
    }


def test_the_record_never_takes_the_credential():
    endpoint = dataclasses.replace(Endpoint.from_record(RECORD), auth={"password": "hunter2"})
    assert "hunter2" not in endpoint.record().to_bytes("/services/db/p2:replica-b").decode()


def test_to_dict_is_json_with_every_field_but_auth():
    endpoint = dataclasses.replace(
        Endpoint.from_record(RECORD, joined=9),
        metrics=MappingProxyType({"lag": 1.5}),
        metrics_at=1795317001.0,
        auth=MappingProxyType({"user": "u", "password": "hunter2"}),
    )
    document = endpoint.to_dict()
    shown = {f.name for f in dataclasses.fields(Endpoint)} - {"auth"}
    assert document.keys() == shown | {"name"}
    assert document["name"] == "p2:replica-b"
    assert document["properties"] == {"role": "replica", "tags": ["a"]}
    assert document["metrics"] == {"lag": 1.5}
    text = json.dumps(document)  # plain JSON, no mapping proxies
    assert "hunter2" not in text and '"auth"' not in text


def test_the_command_environment_is_the_plain_fields_of_to_dict():
    endpoint = Endpoint.from_record(RECORD, joined=9)
    environment = instance_environment(endpoint)
    assert environment["SENTINEL_INSTANCE"] == "p2:replica-b"
    assert environment["SENTINEL_PORT"] == "6432"
    assert environment["SENTINEL_URI"] == "postgresql://10.0.0.7:6432"
    assert environment["SENTINEL_METRICS_AT"] == ""  # None is empty
    assert "SENTINEL_PROPERTIES" not in environment and "SENTINEL_AUTH" not in environment
    plain = {k for k, v in endpoint.to_dict().items() if not isinstance(v, dict)} - {"name"}
    assert environment.keys() == {f"SENTINEL_{k.upper()}" for k in plain} | {"SENTINEL_INSTANCE"}
