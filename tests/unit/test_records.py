import contextlib
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.errors import DecodeError, InvalidName, ValidationError, ValueTooLarge
from sentinel.registry.records import (
    MAX_CLIENT_TEXT,
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    MAX_METRIC_TEXT,
    MAX_METRICS,
    MAX_PROPERTY_KEY_LENGTH,
    MAX_VALUE_BYTES,
    ClientRecord,
    InstanceRecord,
    MetricsRecord,
    ServiceSpec,
    decode,
    encode,
    finite_number,
    parse_json,
)

PATH = "/services/db/p1:a"


def make_instance(**overrides):
    fields = dict(service="db", partition="p1", label="a", host="10.0.0.1", port=5432)
    fields.update(overrides)
    return InstanceRecord(**fields)


def test_instance_encodes_as_versioned_json_and_decodes_back():
    record = make_instance(
        scheme="postgresql",
        zone="eu-1",
        weight=2.5,
        properties={"role": "replica", "tags": ["a", "b"]},
    )
    data = record.to_bytes(PATH)
    document = json.loads(data)
    assert document["v"] == 1
    assert document["host"] == "10.0.0.1" and document["port"] == 5432
    assert document["properties"] == {"role": "replica", "tags": ["a", "b"]}
    decoded = InstanceRecord.from_bytes("db", "p1:a", PATH, data)
    assert decoded == record
    assert decoded.registered_at == record.registered_at


def test_properties_are_copied_and_read_only():
    source = {"role": "replica"}
    record = make_instance(properties=source)
    source["role"] = "primary"
    assert record.properties["role"] == "replica"
    with pytest.raises(TypeError):
        record.properties["role"] = "x"


@pytest.mark.parametrize(
    ("overrides", "error", "fragment"),
    [
        (dict(port=0), ValidationError, "outside 1-65535"),
        (dict(port=65536), ValidationError, "outside 1-65535"),
        (dict(port=-1), ValidationError, "outside 1-65535"),
        (dict(port="80"), ValidationError, "must be an integer"),
        (dict(port=True), ValidationError, "must be an integer"),
        (dict(port=80.0), ValidationError, "must be an integer"),
        (dict(host=""), ValidationError, "host"),
        (dict(host="a b"), ValidationError, "host"),
        (dict(host="a/b"), ValidationError, "host"),
        (dict(host="h" * 254), ValidationError, "host"),
        (dict(scheme="HTTP"), ValidationError, "scheme"),
        (dict(scheme=""), ValidationError, "scheme"),
        (dict(status="sleeping"), ValidationError, "status"),
        (dict(weight=-1), ValidationError, "weight"),
        (dict(weight=math.nan), ValidationError, "weight"),
        (dict(weight=math.inf), ValidationError, "weight"),
        (dict(weight="1"), ValidationError, "weight"),
        (dict(zone="eu/1"), InvalidName, "zone"),
        (dict(service="a/b"), InvalidName, "service"),
        (dict(partition=""), InvalidName, "partition"),
        (dict(label="x" * 129), InvalidName, "label"),
        (dict(properties={"k": object()}), ValidationError, "not JSON-serialisable"),
        (dict(properties={"k": math.nan}), ValidationError, "not JSON-serialisable"),
        (dict(properties={"k": {1, 2}}), ValidationError, "not JSON-serialisable"),
        (dict(properties={1: "v"}), ValidationError, "property key"),
        (dict(properties={"": "v"}), ValidationError, "property key"),
        (dict(properties=["k"]), ValidationError, "must be a mapping"),
    ],
)
def test_invalid_instances_raise_typed_errors(overrides, error, fragment):
    with pytest.raises(error, match=fragment):
        make_instance(**overrides)


@pytest.mark.parametrize("host", ["db-1.example.com", "10.0.0.1", "::1", "[fe80::1%eth0]"])
def test_hosts_accept_names_and_addresses(host):
    assert make_instance(host=host).host == host


def test_oversize_value_is_refused_before_writing():
    record = make_instance(properties={"blob": "x" * MAX_VALUE_BYTES})
    with pytest.raises(ValueTooLarge, match="bytes encoded"):
        record.to_bytes(PATH)


def test_encode_refuses_non_json():
    with pytest.raises(ValidationError):
        encode(PATH, {"x": object()})


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (None, "empty"),
        (b"", "empty"),
        (b"\xff\xfe", "not UTF-8 JSON"),
        (b"{not json", "not UTF-8 JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"host": "h"}', "schema version None"),
        (b'{"v": 2, "host": "h"}', "schema version 2"),
        (b'{"v": "1"}', "schema version '1'"),
    ],
)
def test_decode_rejects_garbage(data, fragment):
    with pytest.raises(DecodeError, match=fragment) as info:
        decode(PATH, data)
    assert info.value.path == PATH


def test_decode_rejects_oversize_values():
    with pytest.raises(DecodeError, match="over the limit"):
        decode(PATH, b" " * (MAX_VALUE_BYTES + 1))


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ({"partition": "p1", "label": "a", "port": 1, "scheme": "http"}, "missing field 'host'"),
        (
            {"partition": "p2", "label": "a", "host": "h", "port": 1, "scheme": "http"},
            "do not match the node name",
        ),
        ({"partition": "p1", "label": "a", "host": "h", "port": 0, "scheme": "http"}, "port"),
        (
            {
                "partition": "p1",
                "label": "a",
                "host": "h",
                "port": 1,
                "scheme": "http",
                "registered_at": "yesterday",
            },
            "registered_at",
        ),
    ],
)
def test_instance_decoding_validates_every_field(document, fragment):
    data = json.dumps({"v": 1, **document}).encode()
    with pytest.raises(DecodeError, match=fragment):
        InstanceRecord.from_bytes("db", "p1:a", PATH, data)


@pytest.mark.parametrize("value", [[], 0, "", False, [1], "x"])
def test_stored_properties_and_defaults_that_are_no_mapping_are_decode_errors(value):
    """``[]`` passed as "no properties" once (found by the hostile JSON test): only an absent
    or null field reads as empty."""
    instance = {"v": 1, "partition": "p1", "label": "a", "host": "h", "port": 1}
    data = json.dumps({**instance, "scheme": "http", "properties": value}).encode()
    with pytest.raises(DecodeError, match="properties must be a mapping"):
        InstanceRecord.from_bytes("db", "p1:a", PATH, data)
    spec = json.dumps({"v": 1, "scheme": "http", "shard_policy": None, "defaults": value})
    with pytest.raises(DecodeError, match="must be a mapping"):
        ServiceSpec.from_bytes("db", "/services/db", spec.encode())


def test_absent_or_null_properties_read_as_none():
    instance = {"v": 1, "partition": "p1", "label": "a", "host": "h", "port": 1, "scheme": "http"}
    for document in (instance, {**instance, "properties": None}):
        record = InstanceRecord.from_bytes("db", "p1:a", PATH, json.dumps(document).encode())
        assert dict(record.properties) == {}


def test_instance_decoding_rejects_a_malformed_node_name():
    data = make_instance().to_bytes(PATH)
    with pytest.raises(DecodeError, match="no ':'"):
        InstanceRecord.from_bytes("db", "p1-a", PATH, data)


def test_service_spec_round_trip_and_validation():
    spec = ServiceSpec("db", scheme="postgresql", shard_policy="tenants", defaults={"pool": 5})
    assert ServiceSpec.from_bytes("db", "/services/db", spec.to_bytes("/services/db")) == spec
    with pytest.raises(InvalidName):
        ServiceSpec("db", shard_policy="bad/policy")
    with pytest.raises(DecodeError, match="missing field 'scheme'"):
        ServiceSpec.from_bytes("db", "/services/db", b'{"v": 1}')


def test_mark_departures_is_written_only_when_set_and_read_only_as_a_boolean():
    path = "/services/db"
    plain = ServiceSpec("db").to_bytes(path)
    assert b"mark_departures" not in plain  # an existing spec's bytes are unchanged
    assert ServiceSpec.from_bytes("db", path, plain).mark_departures is False
    marking = ServiceSpec("db", mark_departures=True)
    assert ServiceSpec.from_bytes("db", path, marking.to_bytes(path)) == marking
    with pytest.raises(ValidationError, match="mark_departures must be true or false"):
        ServiceSpec("db", mark_departures=1)  # type: ignore[arg-type]
    for value in (b'"yes"', b"1", b"null"):
        data = b'{"v": 1, "scheme": "http", "mark_departures": ' + value + b"}"
        with pytest.raises(DecodeError, match="mark_departures must be true or false"):
            ServiceSpec.from_bytes("db", path, data)


names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,20}", fullmatch=True)
json_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=10)
    | st.floats(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(
    partition=names,
    label=names,
    port=st.integers(1, 65535),
    weight=st.floats(0, 1e6),
    properties=st.dictionaries(st.text(min_size=1, max_size=10), json_values, max_size=5),
)
def test_any_valid_instance_survives_the_round_trip(partition, label, port, weight, properties):
    record = make_instance(
        partition=partition, label=label, port=port, weight=weight, properties=properties
    )
    path = f"/services/db/{partition}:{label}"
    assert (
        InstanceRecord.from_bytes("db", f"{partition}:{label}", path, record.to_bytes(path))
        == record
    )


VALID_FIELDS = {
    "host": "h",
    "port": 80,
    "scheme": "http",
    "status": "up",
    "weight": 1,
    "zone": "z",
    "properties": {},
    "registered_at": 1.0,
}
# Each field is valid or arbitrary JSON, so that checks late in validation are reached too.
shaped_documents = st.fixed_dictionaries(
    {
        "v": st.just(1),
        "partition": st.just("p1"),
        "label": st.just("a"),
        **{name: st.just(valid) | json_values for name, valid in VALID_FIELDS.items()},
    }
).map(lambda d: json.dumps(d).encode())


@given(
    data=st.binary(max_size=200)
    | st.builds(lambda v: json.dumps(v).encode(), json_values)
    | shaped_documents
)
def test_arbitrary_bytes_either_decode_or_raise_decode_error(data):
    with contextlib.suppress(DecodeError):
        InstanceRecord.from_bytes("db", "p1:a", PATH, data)


def _deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    "overrides",
    [
        {"weight": 10**400},
        {"weight": -(10**400)},
        {"registered_at": 10**400},
        {"properties": {"big": 10**400}},
        {"properties": {"deep": _deep(5_000)}},
        {"properties": {"nan": math.nan}},
    ],
)
def test_writers_refuse_what_readers_would_refuse_with_validation_error(overrides):
    """Issue 16: numbers past float range and deep nesting are typed errors before writing."""
    with pytest.raises(ValidationError):
        make_instance(**overrides).to_bytes(PATH)


@pytest.mark.parametrize("values", [{"lag": 10**400}, {"lag": -(10**400)}, {"lag": math.inf}])
def test_metrics_past_float_range_are_validation_errors(values):
    with pytest.raises(ValidationError):
        MetricsRecord("db", "p1", "a", values, measured_at=1.0)
    with pytest.raises(ValidationError):
        MetricsRecord("db", "p1", "a", {"lag": 1}, measured_at=10**400)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nesting of 100000 levels"),
        (b'{"a":' * 65 + b"1" + b"}" * 65, "nesting of 65 levels"),
        (b'{"v":1,"x":' + str(10**1000).encode() + b"}", "an integer of 1001 digits"),
        (b'{"v":1,"x":1e400}', "out of float range"),
        (b'{"v":1,"x":-Infinity}', "-Infinity is not a number"),
        (b'{"v":1,"x":NaN}', "NaN is not a number"),
        (b'{"v":1,"x":"\xed\xa0\x80"}', "not UTF-8 JSON"),
    ],
)
def test_decode_bounds_nesting_and_numbers_before_parsing(data, fragment):
    with pytest.raises(DecodeError, match=fragment) as caught:
        decode(PATH, data)
    assert caught.value.path == PATH


def test_brackets_inside_strings_do_not_count_as_nesting():
    data = json.dumps({"v": 1, "x": "[{" * 1000, "y": [[["ok"]]]}).encode()
    assert decode(PATH, data)["y"] == [[["ok"]]]


@pytest.mark.parametrize(
    "field", [("weight", 10**400), ("registered_at", 10**300), ("port", 10**300)]
)
def test_numbers_that_break_a_record_are_decode_errors(field):
    document = {"v": 1, "partition": "p1", "label": "a", "host": "h", "port": 1, "scheme": "http"}
    document[field[0]] = field[1]
    data = json.dumps(document).encode()
    with pytest.raises(DecodeError):
        InstanceRecord.from_bytes("db", "p1:a", PATH, data)


# --- /clients (issue 17) -------------------------------------------------------------------

CLIENT_PATH = "/clients/db/billing-api-3"
CLIENT_DOCUMENT = {
    "client_id": "billing-api-3",
    "app": "billing-api",
    "host": "app-3",
    "pid": 4121,
    "started": 1795317000.2,
    "sentinel_version": "0.1.0",
    "auth_client": "billing-api",
    "auth_version": 3,
}


def test_client_record_round_trip_keeps_the_documented_layout():
    record = ClientRecord(service="db", **CLIENT_DOCUMENT)
    data = record.to_bytes(CLIENT_PATH)
    assert json.loads(data) == {"v": 1, **CLIENT_DOCUMENT}  # docs/znodes.md's example
    assert ClientRecord.from_bytes("db", "billing-api-3", CLIENT_PATH, data) == record
    assert record.confirms_for == "billing-api"


def test_client_record_fields_but_the_identity_are_optional():
    """Nodes of older clients (and a bare ``{"v": 1}``) decode; each names its own client."""
    bare = ClientRecord.from_bytes("db", "old-7", CLIENT_PATH, b'{"v": 1}')
    assert (bare.client_id, bare.app, bare.auth_client, bare.auth_version) == (
        "old-7",
        None,
        None,
        None,
    )
    assert bare.confirms_for == "old-7"


def test_client_record_trusts_the_node_name_over_the_client_id_it_holds():
    data = json.dumps({"v": 1, "client_id": "someone-else", "auth_version": 2}).encode()
    record = ClientRecord.from_bytes("db", "billing-api-3", CLIENT_PATH, data)
    assert (record.client_id, record.auth_version) == ("billing-api-3", 2)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("app", "not a name"),
        ("app", 7),
        ("auth_client", "../etc"),
        ("auth_client", ["billing-api"]),
        ("auth_version", -1),
        ("auth_version", "3"),
        ("auth_version", True),
        ("auth_version", 2.5),
        ("auth_version", 2**53),  # above every version a manager issues
        ("auth_version", 10**300 - 2),
        ("pid", 0),
        ("pid", "4121"),
        ("started", "yesterday"),
        ("host", "h" * (MAX_CLIENT_TEXT + 1)),
        ("host", {"name": "h"}),
        ("sentinel_version", 1),
    ],
)
def test_client_record_refuses_garbage_as_decode_errors(field, value):
    data = json.dumps({"v": 1, **CLIENT_DOCUMENT, field: value}).encode()
    with pytest.raises(DecodeError) as caught:
        ClientRecord.from_bytes("db", "billing-api-3", CLIENT_PATH, data)
    assert caught.value.path == CLIENT_PATH
    with pytest.raises(ValidationError):  # and the writer never writes it
        ClientRecord(service="db", **{**CLIENT_DOCUMENT, field: value})


@pytest.mark.parametrize(
    "data",
    [b"", b"[]", b'{"v": 2}', b"\xff", b"[" * 100_000, b'{"v": 1, "pid": ' + b"9" * 1_000 + b"}"],
)
def test_client_record_refuses_undecodable_nodes(data):
    with pytest.raises(DecodeError):
        ClientRecord.from_bytes("db", "billing-api-3", CLIENT_PATH, data)


@given(data=st.binary(max_size=200) | st.builds(lambda v: json.dumps(v).encode(), json_values))
def test_arbitrary_bytes_either_decode_as_a_client_record_or_raise_decode_error(data):
    with contextlib.suppress(DecodeError):
        ClientRecord.from_bytes("db", "billing-api-3", CLIENT_PATH, data)


# The bounds of parse_json at their edges (found by mutation testing, docs/testing-history.md): the
# limits are inclusive, and a refusal names the node's path.


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_nesting_up_to_the_limit_parses_and_one_more_is_refused():
    assert parse_json(PATH, nested(MAX_JSON_DEPTH)) is not None
    with pytest.raises(DecodeError, match=f"nesting of {MAX_JSON_DEPTH + 1} levels") as refused:
        parse_json(PATH, nested(MAX_JSON_DEPTH + 1))
    assert refused.value.path == PATH


def test_nesting_is_the_deepest_path_not_the_bracket_count():
    # Many brackets in siblings (counted past the limit), each shallow: accepted.
    siblings = "[" + ",".join([nested(MAX_JSON_DEPTH - 1)] * 3) + "]"
    assert len(parse_json(PATH, siblings)) == 3
    # Brackets inside strings are text, not nesting.
    assert parse_json(PATH, json.dumps(["[" * 200])) == ["[" * 200]
    # Closed siblings before a deep branch: the depth is followed, not guessed.
    deep_after = "[" + "[]," * 10 + nested(MAX_JSON_DEPTH) + "]"
    with pytest.raises(DecodeError, match=f"nesting of {MAX_JSON_DEPTH + 1} levels"):
        parse_json(PATH, deep_after)


def test_integers_up_to_the_digit_limit_parse_and_one_digit_more_is_refused():
    limit = "9" * MAX_INT_DIGITS
    assert parse_json(PATH, limit) == int(limit)
    assert parse_json(PATH, "-" + limit) == -int(limit)  # the sign is not a digit
    with pytest.raises(DecodeError, match=f"at most {MAX_INT_DIGITS}") as refused:
        parse_json(PATH, limit + "9")
    assert refused.value.path == PATH


def test_floats_out_of_range_are_refused_by_name():
    with pytest.raises(DecodeError, match="a number out of float range"):
        parse_json(PATH, "1e400")


def test_a_value_of_exactly_max_bytes_parses_and_one_byte_more_is_refused():
    value = b"[" + b" " * 8 + b"]"  # 10 bytes
    assert parse_json(PATH, value, max_bytes=10) == []
    with pytest.raises(DecodeError, match="value of 11 bytes is over the limit of 10") as refused:
        parse_json(PATH, value + b" ", max_bytes=10)
    assert refused.value.path == PATH


def test_finite_number_says_what_is_wrong():
    with pytest.raises(ValidationError, match=r"^weight must be a number, got str$"):
        finite_number("weight", "1")
    with pytest.raises(ValidationError, match=r"^weight is an integer too large for a float$"):
        finite_number("weight", 10**400)
    with pytest.raises(ValidationError, match=r"^weight -1 must be a finite number >= 0$"):
        finite_number("weight", -1, minimum=0)
    with pytest.raises(ValidationError, match=r"^weight inf must be a finite number$"):
        finite_number("weight", math.inf)
    assert finite_number("weight", 0, minimum=0) == 0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("app", "not a name", "^app name 'not a name' may only hold"),
        ("auth_client", "../etc", "^auth client name '../etc' may only hold"),
        ("pid", 0, "^pid must be an integer >= 1, got 0$"),
        ("pid", True, "^pid must be an integer >= 1, got True$"),
        (
            "auth_version",
            -1,
            "^auth_version must be an integer from 0 to 9007199254740991, got -1$",
        ),
        ("host", "h" * (MAX_CLIENT_TEXT + 1), "^host must be a string of at most 256 characters$"),
        ("sentinel_version", 1, "^sentinel_version must be a string of at most 256 characters$"),
        ("started", "x", "^started must be a number, got str$"),
    ],
)
def test_client_record_names_the_field_it_refuses(field, value, message):
    with pytest.raises(ValidationError, match=message):
        ClientRecord(service="db", client_id="c", **{field: value})


def test_client_record_bounds_are_inclusive():
    edge = ClientRecord(
        service="db",
        client_id="c",
        pid=1,
        auth_version=0,
        host="h" * MAX_CLIENT_TEXT,
        sentinel_version="v" * MAX_CLIENT_TEXT,
        started=0,
    )
    assert (edge.pid, edge.auth_version, len(edge.host), len(edge.sentinel_version)) == (
        1,
        0,
        MAX_CLIENT_TEXT,
        MAX_CLIENT_TEXT,
    )


METRICS_PATH = "/metrics/db/p1:a"


def test_metrics_record_round_trip():
    record = MetricsRecord("db", "p1", "a", {"lag": 3, "state": "ok", "load": 0.5}, 12.5)
    data = record.to_bytes(METRICS_PATH)
    assert json.loads(data) == {
        "v": 1,
        "measured_at": 12.5,
        "metrics": {"lag": 3, "state": "ok", "load": 0.5},
    }
    back = MetricsRecord.from_bytes("db", "p1:a", METRICS_PATH, data)
    assert (back.service, back.partition, back.label, back.measured_at) == ("db", "p1", "a", 12.5)
    assert dict(back.values) == {"lag": 3, "state": "ok", "load": 0.5}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"measured_at": 1.0, "metrics": [1]}, "metrics must be a mapping, got list"),
        ({"measured_at": 1.0, "metrics": {"a%": 1}}, "metric name 'a%' may only hold"),
        (
            {"measured_at": 1.0, "metrics": {"a": "x" * (MAX_METRIC_TEXT + 1)}},
            "metric 'a' is a string of 257 characters; at most 256 are allowed",
        ),
        (
            {"measured_at": 1.0, "metrics": {"a": True}},
            "metric 'a' must be a number or a string, got bool",
        ),
        (
            {"measured_at": 1.0, "metrics": {f"m{i}": 1 for i in range(MAX_METRICS + 1)}},
            "257 metrics given; at most 256 are allowed",
        ),
        ({"measured_at": "now", "metrics": {}}, "measured_at must be a number, got str"),
        ({"metrics": {}}, "measured_at"),
        ({"measured_at": 1.0}, "metrics"),
    ],
)
def test_metrics_record_refusals_are_decode_errors_naming_the_problem(document, message):
    data = json.dumps({"v": 1, **document}).encode()
    with pytest.raises(DecodeError, match=message) as caught:
        MetricsRecord.from_bytes("db", "p1:a", METRICS_PATH, data)
    assert caught.value.path == METRICS_PATH


def test_metrics_record_bounds_are_inclusive():
    values = {f"m{i}": "x" * MAX_METRIC_TEXT for i in range(MAX_METRICS)}
    assert len(MetricsRecord("db", "p1", "a", values, 1.0).values) == MAX_METRICS
    with pytest.raises(DecodeError, match="node name"):
        MetricsRecord.from_bytes(
            "db", "no-colon", METRICS_PATH, b'{"v":1,"measured_at":1,"metrics":{}}'
        )


# Every decoder names the node it refused, whatever failed: the bytes, or a field.
DECODERS = {
    "spec": lambda data: ServiceSpec.from_bytes("db", "/services/db", data),
    "instance": lambda data: InstanceRecord.from_bytes("db", "p1:a", "/services/db/p1:a", data),
    "metrics": lambda data: MetricsRecord.from_bytes("db", "p1:a", "/metrics/db/p1:a", data),
    "client": lambda data: ClientRecord.from_bytes("db", "c", "/clients/db/c", data),
}
DECODER_PATHS = {
    "spec": "/services/db",
    "instance": "/services/db/p1:a",
    "metrics": "/metrics/db/p1:a",
    "client": "/clients/db/c",
}
BAD_FIELD = {
    "spec": b'{"v": 1, "scheme": 7}',
    "instance": b'{"v": 1, "partition": "p1", "label": "a", "host": "h", "port": "x"}',
    "metrics": b'{"v": 1, "measured_at": "x", "metrics": {}}',
    "client": b'{"v": 1, "pid": 0}',
}


@pytest.mark.parametrize("kind", sorted(DECODERS))
def test_each_decoder_names_the_node_it_refuses(kind):
    for data in (b"\xff", BAD_FIELD[kind]):
        with pytest.raises(DecodeError) as caught:
            DECODERS[kind](data)
        assert caught.value.path == DECODER_PATHS[kind], (kind, data)


def test_an_instance_node_under_another_name_is_refused_naming_it():
    data = make_instance().to_bytes(PATH)
    with pytest.raises(DecodeError, match="partition and label do not match") as caught:
        InstanceRecord.from_bytes("db", "p1:b", PATH, data)
    assert caught.value.path == PATH


def test_an_instance_without_the_optional_fields_gets_their_defaults():
    data = b'{"v": 1, "partition": "p1", "label": "a", "host": "h", "port": 80, "scheme": "http"}'
    record = InstanceRecord.from_bytes("db", "p1:a", PATH, data)
    assert (record.status, record.weight, record.registered_at) == ("up", 1, 0.0)


@pytest.mark.parametrize("field", ["service", "partition", "label"])
def test_metrics_record_names_the_name_it_refuses(field):
    names = {"service": "db", "partition": "p1", "label": "a", field: "bad name"}
    with pytest.raises(ValidationError, match=f"^{field} name 'bad name'"):
        MetricsRecord(**names, values={}, measured_at=1.0)


def test_metrics_record_values_are_checked_and_read_only():
    record = MetricsRecord("db", "p1", "a", {"lag": 1}, 1.0)
    with pytest.raises(TypeError):
        record.values["lag"] = 2  # type: ignore[index]
    with pytest.raises(ValidationError, match=r"^metric 'lag' inf must be a finite number$"):
        MetricsRecord("db", "p1", "a", {"lag": math.inf}, 1.0)


def test_a_non_default_status_and_the_spec_defaults_survive_the_round_trip():
    draining = make_instance(status="draining", weight=3)
    back = InstanceRecord.from_bytes("db", "p1:a", PATH, draining.to_bytes(PATH))
    assert (back.status, back.weight) == ("draining", 3)
    spec = ServiceSpec("db", defaults={"pool": {"size": 5}})
    assert dict(spec.defaults) == {"pool": {"size": 5}}
    again = ServiceSpec.from_bytes("db", "/services/db", spec.to_bytes("/services/db"))
    assert dict(again.defaults) == {"pool": {"size": 5}}


def test_encode_writes_compact_json_up_to_the_byte_limit_inclusive():
    assert encode(PATH, {"a": [1, 2]}) == b'{"v":1,"a":[1,2]}'
    overhead = len(encode(PATH, {"x": ""}))
    assert len(encode(PATH, {"x": "y" * (MAX_VALUE_BYTES - overhead)})) == MAX_VALUE_BYTES
    with pytest.raises(ValueTooLarge, match=f"^value for {PATH} is {MAX_VALUE_BYTES + 1} bytes"):
        encode(PATH, {"x": "y" * (MAX_VALUE_BYTES - overhead + 1)})


def test_a_property_key_of_the_maximum_length_is_accepted():
    key = "k" * MAX_PROPERTY_KEY_LENGTH
    assert dict(make_instance(properties={key: 1}).properties) == {key: 1}
    with pytest.raises(ValidationError):
        make_instance(properties={key + "k": 1})


def test_nesting_is_followed_back_down_after_a_branch_closes():
    # [[[], then 63 levels: 2 + 63 = 65 deep, though a branch closed on the way.
    data = "[[[]," + nested(MAX_JSON_DEPTH - 1) + "]]"
    with pytest.raises(DecodeError, match=f"nesting of {MAX_JSON_DEPTH + 1} levels"):
        parse_json(PATH, data)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ServiceSpec("bad name"), "^service name 'bad name'"),
        (lambda: ServiceSpec("db", shard_policy="bad name"), "^shard policy name 'bad name'"),
        (lambda: make_instance(service="bad name"), "^service name 'bad name'"),
        (lambda: make_instance(partition="bad name"), "^partition name 'bad name'"),
        (lambda: make_instance(label="bad name"), "^label name 'bad name'"),
        (lambda: make_instance(zone="bad name"), "^zone name 'bad name'"),
        (lambda: make_instance(port="80"), "^port must be an integer, got str$"),
        (lambda: make_instance(weight=-1), "^weight -1 must be a finite number >= 0$"),
        (lambda: make_instance(registered_at="x"), "^registered_at must be a number, got str$"),
        (lambda: ClientRecord(service="bad name", client_id="c"), "^service name 'bad name'"),
        (lambda: ClientRecord(service="db", client_id="bad name"), "^client name 'bad name'"),
    ],
)
def test_records_name_the_field_they_refuse(build, message):
    with pytest.raises(ValidationError, match=message):
        build()


def test_a_decoded_instance_names_a_bad_registered_at():
    data = json.dumps(
        {"v": 1, "partition": "p1", "label": "a", "host": "h", "port": 80, "scheme": "http"}
        | {"registered_at": "x"}
    ).encode()
    with pytest.raises(DecodeError, match="registered_at must be a number"):
        InstanceRecord.from_bytes("db", "p1:a", PATH, data)


def test_the_highest_port_is_accepted_and_one_more_is_not():
    assert make_instance(port=65535).port == 65535
    with pytest.raises(ValidationError):
        make_instance(port=65536)


def test_spec_defaults_and_properties_are_read_only_copies_and_none_is_empty():
    given = {"pool": {"size": 5}}
    spec = ServiceSpec("db", defaults=given)
    given["pool"]["size"] = 6  # a deep copy: the caller's dict changing later changes nothing
    assert spec.defaults["pool"]["size"] == 5
    with pytest.raises(TypeError):
        spec.defaults["pool"] = {}  # type: ignore[index]
    assert dict(make_instance(properties=None).properties) == {}
    assert dict(ServiceSpec("db", defaults=None).defaults) == {}
    with pytest.raises(ValidationError, match=r"^properties must be a mapping, got list$"):
        make_instance(properties=[1])


def test_decoded_instances_share_the_values_instances_repeat():
    """A cache holds one record per instance: the partition, scheme, status and zone many
    instances repeat, and empty properties, are one object each, not one per instance."""
    decoded = []
    for label in ("a", "b"):
        path = f"/sentinel/services/db/p1:{label}"
        written = InstanceRecord("db", "p1", label, "10.0.0.1", 5432, zone="eu-1", scheme="pg")
        decoded.append(InstanceRecord.from_bytes("db", f"p1:{label}", path, written.to_bytes(path)))
    first, second = decoded
    for name in ("partition", "scheme", "status", "zone", "properties"):
        assert getattr(first, name) is getattr(second, name), name
    assert first.properties == {} and first.zone == "eu-1"
