"""Shard policies: which partition holds a key, in four modules of one concern each.

* :mod:`sentinel.shards.spec`: a policy's spec, the layout of its nodes, the codecs (pure);
* :mod:`sentinel.shards.maps`: the client-side lookups for ``directory``, ``range`` and
  ``hash`` policies, and the one key rule they share;
* :mod:`sentinel.shards.store`: reading and creating policies in ZooKeeper, and the
  compare-and-set writes of a directory's keys;
* :mod:`sentinel.shards.placement`: the queue of keys waiting for the shard manager.

The names below are the ones :class:`~sentinel.client.Sentinel`'s shard methods use; other
modules import from the module that defines what they need.
"""

from sentinel.shards.maps import shard_key
from sentinel.shards.placement import request_placement
from sentinel.shards.spec import DEFAULT_BUCKETS, ShardPolicySpec, policy_path
from sentinel.shards.store import create_policy, read_spec, update_keys

__all__ = [
    "DEFAULT_BUCKETS",
    "ShardPolicySpec",
    "create_policy",
    "policy_path",
    "read_spec",
    "request_placement",
    "shard_key",
    "update_keys",
]
