"""Shard specs and the client-side lookup structures (no server)."""

import json
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.errors import (
    DecodeError,
    InvalidName,
    ShardMapInvalid,
    ValidationError,
    ValueTooLarge,
)
from sentinel.shards.maps import DirectoryMap, HashMap, RangeMap, jump_hash
from sentinel.shards.spec import (
    ShardPolicySpec,
    bucket_name,
    bucket_of,
    decode_bucket,
    encode_bucket,
    validate_key,
)


def test_bucket_of_is_crc32_of_the_utf8_key():
    assert bucket_of("tenant-42", 256) == zlib.crc32(b"tenant-42") % 256
    assert bucket_of("é", 7) == zlib.crc32("é".encode()) % 7
    assert bucket_name(255) == "00ff"


def test_jump_hash_matches_guavas_golden_values():
    # Guava's Hashing.consistentHash implements the same algorithm; these are its test vectors,
    # so a map written by a JVM shard manager agrees with ours.
    golden100 = [0, 55, 62, 8, 45, 59, 86, 97, 82, 59, 73, 37, 17, 56, 86, 21, 90, 37, 38, 83]
    assert [jump_hash(k, 100) for k in range(20)] == golden100
    assert jump_hash(10863919174838991, 11) == 6
    assert jump_hash(2016238256797177309, 11) == 3
    assert jump_hash(1673758223894951030, 11) == 5
    assert jump_hash(2, 100001) == 80343
    assert jump_hash(2201, 100001) == 22152
    assert jump_hash(2202, 100001) == 15018


@given(st.integers(0, 2**64 - 1), st.integers(1, 200))
def test_jump_hash_moves_a_key_only_to_the_new_bucket(key, n):
    before, after = jump_hash(key, n), jump_hash(key, n + 1)
    assert after in (before, n)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        (dict(kind="tree"), "kind"),
        (dict(kind="hash"), "non-empty list of partitions"),
        (dict(kind="hash", partitions=()), "non-empty list of partitions"),
        (dict(kind="directory", partitions=("p1", "p1")), "must not repeat"),
        (dict(kind="directory", buckets=0), "buckets"),
        (dict(kind="directory", buckets=70000), "buckets"),
        (dict(kind="directory", boundaries=(("a", "p1"),)), "only range"),
        (dict(kind="range"), "at least one"),
        (dict(kind="range", boundaries=(("m", "p2"), ("a", "p1"))), "strictly increasing"),
        (dict(kind="range", boundaries=(("a", "p1"), ("a", "p2"))), "strictly increasing"),
        (dict(kind="range", boundaries=(("a",),)), "pair"),
        (dict(kind="range", key_type="int", boundaries=(("x", "p1"),)), "not an integer"),
        (dict(kind="range", key_type="float", boundaries=((1, "p1"),)), "key_type"),
        (
            dict(kind="range", partitions=("p1",), boundaries=((0, "p2"),), key_type="int"),
            "not declared",
        ),
    ],
)
def test_invalid_specs_are_rejected(fields, fragment):
    with pytest.raises(ValidationError, match=fragment):
        ShardPolicySpec(policy="t", **fields)


def test_invalid_partition_names_in_specs_are_rejected():
    with pytest.raises(InvalidName):
        ShardPolicySpec(policy="t", kind="hash", partitions=("p/1",))


def test_specs_round_trip():
    for spec in (
        ShardPolicySpec("t", "directory", partitions=("p1", "p2"), buckets=16),
        ShardPolicySpec("t", "range", boundaries=((0, "p1"), (100, "p2")), key_type="int"),
        ShardPolicySpec("t", "hash", partitions=("a", "b", "c")),
    ):
        assert ShardPolicySpec.from_bytes("t", "/shard_info/t", spec.to_bytes("/x")) == spec


def test_undecodable_spec_is_a_decode_error():
    with pytest.raises(DecodeError, match="kind"):
        ShardPolicySpec.from_bytes("t", "/shard_info/t", b'{"v": 1, "kind": "tree"}')
    with pytest.raises(DecodeError, match="missing field 'kind'"):
        ShardPolicySpec.from_bytes("t", "/shard_info/t", b'{"v": 1}')


def test_check_partition_enforces_the_declared_set():
    spec = ShardPolicySpec("t", "directory", partitions=("p1",))
    assert spec.check_partition("p1") == "p1"
    with pytest.raises(ValidationError, match="not one of"):
        spec.check_partition("p2")
    assert ShardPolicySpec("t", "directory").check_partition("anything") == "anything"


@pytest.mark.parametrize("key", ["", "x" * 257, None, 1.5, b"bytes", True])
def test_invalid_keys(key):
    with pytest.raises(ValidationError):
        validate_key(key)


def test_int_keys_are_their_decimal_string():
    assert validate_key(42) == "42"


def test_directory_map_applies_buckets_and_reports_changes():
    shard_map = DirectoryMap(ShardPolicySpec("t", "directory", buckets=4))
    assert shard_map.apply_bucket(1, {"a": "p1", "b": "p1"}) == {
        "a": (None, "p1"),
        "b": (None, "p1"),
    }
    assert shard_map.apply_bucket(1, {"a": "p2", "c": "p1"}) == {
        "a": ("p1", "p2"),
        "b": ("p1", None),
        "c": (None, "p1"),
    }
    assert shard_map.apply_bucket(1, {"a": "p2", "c": "p1"}) == {}
    assert shard_map.lookup("a") == "p2" and shard_map.lookup("b") is None
    assert shard_map.apply_bucket(2, {"7": "p3"}) == {"7": (None, "p3")}
    assert shard_map.lookup("7") == "p3"
    # The lookup is dict.get itself; an int key misses and the client normalises it.
    assert shard_map.lookup(7) is None
    # Each bucket reads back as last applied (the snapshot file and the host agent send it).
    assert shard_map.bucket(1) == {"a": "p2", "c": "p1"}
    assert shard_map.bucket(2) == {"7": "p3"} and shard_map.bucket(0) == {}
    shard_map.keys.pop("c")  # gone under a reader's feet: left out, not a KeyError
    assert shard_map.bucket(1) == {"a": "p2"}


def test_range_map_bisects_typed_keys():
    spec = ShardPolicySpec(
        "t", "range", boundaries=((0, "low"), (100, "mid"), (1000, "high")), key_type="int"
    )
    shard_map = RangeMap(spec)
    assert [shard_map.lookup(k) for k in (0, 99, 100, "999", 1000, 10**9)] == [
        "low",
        "low",
        "mid",
        "mid",
        "high",
        "high",
    ]
    assert shard_map.lookup(-1) is None
    assert shard_map.lookup("not-a-number") is None
    text = RangeMap(ShardPolicySpec("t", "range", boundaries=(("a", "p1"), ("n", "p2"))))
    assert (text.lookup("apple"), text.lookup("zebra"), text.lookup("A")) == ("p1", "p2", None)


def test_hash_map_is_deterministic_and_bounded(monkeypatch):
    spec = ShardPolicySpec("t", "hash", partitions=("a", "b", "c", "d"))
    first, second = HashMap(spec), HashMap(spec)
    keys = [f"tenant-{i}" for i in range(2000)]
    assert [first.lookup(k) for k in keys] == [second.lookup(k) for k in keys]
    counts = {p: sum(first.lookup(k) == p for k in keys) for p in spec.partitions}
    assert all(400 <= n <= 600 for n in counts.values()), counts
    monkeypatch.setattr(HashMap, "MEMO_SIZE", 10)
    bounded = HashMap(spec)
    for key in keys:
        bounded.lookup(key)
    assert len(bounded._memo) == 10


def test_bucket_codec_validates_entries():
    mapping = {"k1": "p1", "k2": "p2", "k3": "p1"}
    one = ShardPolicySpec("t", "directory", buckets=1)  # every key's own bucket is 0
    encoded = encode_bucket("/b", mapping)
    assert json.loads(encoded) == {"v": 1, "partitions": {"p1": ["k1", "k3"], "p2": ["k2"]}}
    assert decode_bucket(one, 0, encoded) == mapping
    with pytest.raises(DecodeError, match="'partitions'"):
        decode_bucket(one, 0, b'{"v": 1, "partitions": []}')
    with pytest.raises(DecodeError, match="partition"):
        decode_bucket(one, 0, b'{"v": 1, "partitions": {"bad/partition": ["k"]}}')
    with pytest.raises(DecodeError, match="must be a list"):
        decode_bucket(one, 0, b'{"v": 1, "partitions": {"p1": "k"}}')
    with pytest.raises(DecodeError, match="shard key"):
        decode_bucket(one, 0, b'{"v": 1, "partitions": {"p1": [""]}}')
    with pytest.raises(ValueTooLarge, match="more buckets"):
        encode_bucket("/b", {f"key-{i:08d}-{'x' * 20}": "p1" for i in range(30000)})


def test_a_bucket_that_contradicts_its_policy_is_refused_naming_what_is_wrong():
    """A bucket decodes only as the policy's own: each key in the bucket crc32 puts it in,
    each partition declared (when the policy declares them), a bucket number it has."""
    spec = ShardPolicySpec("t", "directory", partitions=("p1", "p2"), buckets=16)
    home = bucket_of("acme", 16)
    stranger = next(k for k in (f"k{i}" for i in range(100)) if bucket_of(k, 16) != home)
    assert decode_bucket(spec, home, encode_bucket("/b", {"acme": "p1"})) == {"acme": "p1"}
    misplaced = encode_bucket("/b", {"acme": "p1", stranger: "p2"})
    with pytest.raises(ShardMapInvalid) as caught:
        decode_bucket(spec, home, misplaced)
    error = caught.value
    assert (error.policy, error.bucket, error.key, error.partition) == ("t", home, stranger, "p2")
    assert f"belongs in bucket {bucket_of(stranger, 16)}, not {home}" in str(error)
    with pytest.raises(ShardMapInvalid, match="'p9', which policy 't' does not declare") as caught:
        decode_bucket(spec, home, encode_bucket("/b", {"acme": "p9"}))
    assert (caught.value.key, caught.value.partition) == ("acme", "p9")
    with pytest.raises(ShardMapInvalid, match="not a bucket 16"):
        decode_bucket(spec, 16, encode_bucket("/b", {}))
    # A directory that declares no partitions takes any valid name.
    free = ShardPolicySpec("t", "directory", buckets=16)
    assert decode_bucket(free, home, encode_bucket("/b", {"acme": "p9"})) == {"acme": "p9"}
