"""What the client-side shard maps answer, on exact values (no server).

The hash placement is a contract between clients: every client (and a shard manager in another
language) must send a key to the same partition. The values below come from outside this
code: the BLAKE2b digests from coreutils' ``b2sum -l 64``, the jump hash from Lamping and
Veach's C++ (figure 1 of the paper, compiled with gcc) and ClickHouse's
``jumpConsistentHash`` test results.
"""

import pytest

from sentinel.errors import PartitionNotFound, ValidationError
from sentinel.shards.maps import DirectoryMap, HashMap, RangeMap, jump_hash, new_map, shard_key
from sentinel.shards.spec import ShardPolicySpec

THOUSAND = ShardPolicySpec("spread", "hash", partitions=tuple(f"p{i}" for i in range(1000)))


@pytest.mark.parametrize("key", ["tenant-42", "", 0, 7, -3, 2**70])
def test_shard_key_returns_a_str_or_an_int_unchanged(key):
    returned = shard_key("orders", "tenants", key)
    assert returned == key and type(returned) is type(key)


def test_no_key_for_a_sharded_service_is_partition_not_found():
    with pytest.raises(PartitionNotFound) as caught:
        shard_key("orders", "tenants", None)
    error = caught.value
    assert (error.service, error.key, error.shard_policy) == ("orders", None, "tenants")
    assert str(error) == (
        "service 'orders': key None maps to no partition "
        "(sharded by policy 'tenants': a key is required)"
    )


@pytest.mark.parametrize(
    ("key", "type_name"),
    [(True, "bool"), (False, "bool"), (3.5, "float"), (b"k", "bytes"), (("k",), "tuple")],
)
def test_a_key_of_another_type_is_a_validation_error_naming_it(key, type_name):
    with pytest.raises(ValidationError) as caught:
        shard_key("orders", "tenants", key)
    assert str(caught.value) == (
        f"service 'orders': shard key {key!r} must be a str or an int, not {type_name}"
    )


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        (ShardPolicySpec("tenants", "directory", buckets=8), DirectoryMap),
        (ShardPolicySpec("ids", "range", boundaries=((0, "low"),), key_type="int"), RangeMap),
        (ShardPolicySpec("spread", "hash", partitions=("h0", "h1")), HashMap),
    ],
)
def test_new_map_builds_the_kind_the_spec_names_and_keeps_the_spec(spec, kind):
    # The snapshot file writes each map's spec back from ``shard_map.spec``.
    shard_map = new_map(spec)
    assert type(shard_map) is kind
    assert shard_map.spec is spec


def test_a_new_directory_map_is_empty_with_one_empty_slot_per_bucket():
    shard_map = new_map(ShardPolicySpec("tenants", "directory", buckets=8))
    assert shard_map.keys == {} and shard_map.lookup("anything") is None
    # Every bucket can be applied (and emptied) before any was filled.
    assert [shard_map.apply_bucket(i, {}) for i in range(8)] == [{}] * 8


def test_a_key_two_buckets_listed_is_removed_from_both_without_an_error():
    # A bucket node written by hand (or by a faulty writer) can hold a key of another bucket;
    # the live cache applies it as read, so emptying both must not fail on the second.
    shard_map = DirectoryMap(ShardPolicySpec("tenants", "directory", buckets=4))
    shard_map.apply_bucket(1, {"k": "p1"})
    assert shard_map.apply_bucket(2, {"k": "p2"}) == {"k": ("p1", "p2")}
    assert shard_map.apply_bucket(2, {}) == {"k": ("p2", None)}
    changes = shard_map.apply_bucket(1, {})
    assert changes.get("k", (None, None)) == (None, None)
    assert shard_map.keys == {} and shard_map.lookup("k") is None


def test_jump_hash_matches_the_papers_code_and_clickhouse():
    clickhouse = [(1, 1, 0), (42, 57, 43), (256, 1024, 520), (3735883980, 1, 0)]
    clickhouse += [(3735883980, 666, 361), (16045690984833335023, 255, 237)]
    # Keys whose last step divides by a small number: a denominator off by one moves them.
    paper = [(6965, 100001, 91906), (9501, 100001, 21608), (10808, 100001, 66350)]
    paper += [(0, 2**31 - 1, 0), (1, 2**31 - 1, 262355607), (2, 2**31 - 1, 736532115)]
    assert [jump_hash(key, n) for key, n, _ in clickhouse + paper] == [
        bucket for _, _, bucket in clickhouse + paper
    ]


def test_one_bucket_takes_every_key():
    assert {jump_hash(key, 1) for key in (0, 1, 2**63, 2**64 - 1)} == {0}


@pytest.mark.parametrize(
    ("key", "partition"),
    [
        # b2sum -l 64 of "tenant-42": f3457af28e099b74, read little-endian 0x749b098ef27a45f3
        ("tenant-42", "p707"),
        # b2sum -l 64 of "42": 57b43cf02666687a, read little-endian 0x7a686626f03cb457
        ("42", "p235"),
        # b2sum -l 64 of the UTF-8 "é" (c3 a9): cb1abf8beff3192f, 0x2f19f3ef8bbf1acb
        ("é", "p906"),
    ],
)
def test_a_hash_map_places_a_key_by_jump_hash_of_its_blake2b_64(key, partition):
    assert HashMap(THOUSAND).lookup(key) == partition


def test_a_hash_map_places_an_int_key_as_its_decimal_string():
    shard_map = HashMap(THOUSAND)
    assert shard_map.lookup(42) == "p235"
    assert shard_map.lookup(42) == "p235"  # answered again (from the memo)
    assert [shard_map.lookup(n) for n in range(50)] == [
        HashMap(THOUSAND).lookup(str(n)) for n in range(50)
    ]
