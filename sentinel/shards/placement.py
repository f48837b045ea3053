"""Placement requests: the queue of keys waiting for the shard manager to assign them.

A client asks with :func:`request_placement` (a persistent node per key under the policy's
``requests`` node); the elected shard manager (:mod:`sentinel.shard_manager`) places each key
with :func:`place_key` and removes the request.
"""

from __future__ import annotations

import contextlib

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError

from sentinel.errors import RegistryConflict
from sentinel.registry.records import encode
from sentinel.shards.spec import (
    Key,
    ShardPolicySpec,
    bucket_of,
    bucket_path,
    decode_bucket,
    encode_bucket,
    policy_path,
    validate_key,
)
from sentinel.shards.store import CAS_ATTEMPTS, DigestWriter, read_directory_spec, read_key
from sentinel.zk.ephemeral import first_failure

REQUESTS = "requests"


def requests_path(policy: str) -> str:
    """Where keys wait for the shard manager to place them (not a bucket name: not hex)."""
    return f"{policy_path(policy)}/{REQUESTS}"


def request_node(policy: str, key: str) -> str:
    """A key's request node; the name is the key's UTF-8 in hex, so any key is a valid name."""
    return f"{requests_path(policy)}/{key.encode('utf-8').hex()}"


def request_placement(zk: KazooClient, policy: str, key: Key) -> bool:
    """Ask the shard manager to place ``key``; False if it is already assigned.

    The request is a persistent node, so it survives until a leader has placed the key.
    """
    text = validate_key(key)
    spec = read_directory_spec(zk, policy)
    if read_key(zk, spec, text) is not None:
        return False
    path = request_node(policy, text)
    with contextlib.suppress(NodeExistsError):  # already requested
        zk.create(path, encode(path, {"key": text}), makepath=True)
    return True


def place_key(zk: KazooClient, spec: ShardPolicySpec, key: str, partition: str) -> str:
    """Assign ``key`` to ``partition`` unless it already has one; return the one it has.

    The check and the write are one compare-and-set on the key's bucket (and on the policy's
    digest, moved in the same transaction), so two managers racing (a leader that has not
    noticed it was replaced) still place a key only once.
    """
    index = bucket_of(key, spec.buckets)
    path = bucket_path(spec.policy, index)
    for _ in range(CAS_ATTEMPTS):
        digest = DigestWriter(zk, spec.policy)  # read along with the bucket
        data, stat = zk.get(path)
        keys = decode_bucket(spec, index, data)
        if key in keys:
            return keys[key]
        after = {**keys, key: spec.check_partition(partition)}
        transaction = zk.transaction()
        transaction.set_data(path, encode_bucket(path, after), version=stat.version)
        digest.add(transaction, keys, after)
        failure = first_failure(transaction.commit())
        if failure is None:
            return partition
        if not isinstance(failure, BadVersionError):
            raise failure
    raise RegistryConflict(f"bucket {path} kept changing while placing {key!r}")
