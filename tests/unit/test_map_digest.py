"""A directory's digest: moved by a change it equals the digest of the map recomputed whole,
and what does not decode as one is a DecodeError, never trusted."""

import random

import pytest

from sentinel.errors import DecodeError
from sentinel.shards.digest import MapDigest


def test_a_digest_moved_change_by_change_equals_the_whole_maps():
    rng = random.Random(42)
    keys: dict[str, str] = {}
    digest = MapDigest()
    for _ in range(500):
        key = f"k{rng.randrange(60)}"
        before = {key: keys[key]} if key in keys else {}
        if rng.random() < 0.3:
            keys.pop(key, None)
        else:
            keys[key] = rng.choice(["p1", "p2", "p3"])
        after = {key: keys[key]} if key in keys else {}
        digest = digest.changed(before, after)
        assert digest == MapDigest.of(keys.items())
    assert digest.keys == len(keys)
    # the pairs count, not only the keys: the same keys elsewhere make another digest
    moved = {k: "p9" for k in keys}
    assert MapDigest.of(moved.items()) != digest


def test_a_digest_round_trips_and_says_when_it_was_written():
    digest = MapDigest.of([("acme", "p1"), ("bolt", "p2")])
    decoded, at = MapDigest.from_bytes("/d", digest.to_bytes("/d"))
    assert decoded == digest and at > 0


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"[]",
        b'{"v":1}',
        b'{"v":1,"keys":true,"sum":"' + b"0" * 64 + b'","at":1}',
        b'{"v":1,"keys":-1,"sum":"' + b"0" * 64 + b'","at":1}',
        b'{"v":1,"keys":1,"sum":"zz","at":1}',
        b'{"v":1,"keys":1,"sum":"' + b"g" * 64 + b'","at":1}',
        b'{"v":1,"keys":1,"sum":"' + b"0" * 64 + b'","at":"now"}',
        b'{"v":1,"keys":1,"sum":"' + b"0" * 64 + b'","at":1e999}',
    ],
)
def test_what_is_not_a_digest_is_a_decode_error(value):
    with pytest.raises(DecodeError):
        MapDigest.from_bytes("/shard_info/tenants/digest", value)
