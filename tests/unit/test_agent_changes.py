"""The agent's deltas on values alone: what ``changes.delta`` says of a change, applied by the
process's decoder to the snapshot before it, gives the snapshot after it; its frame does not grow
with the service; a connection's backlog is bounded."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.agent import changes
from sentinel.agent.changes import Pending
from sentinel.agentlink import protocol
from sentinel.cache.agent import _changes
from sentinel.registry.records import ServiceSpec
from tests.unit.test_snapshot_updates import NAMES, bare, batches, full_build, metrics

PATHS = [f"/services/db/{name}-junk" for name in NAMES[:3]]


def applied(old, fields):
    """What the process serves after applying ``fields`` to ``old`` (as AgentFollower does:
    instances, then metrics)."""
    message = json.loads(json.dumps(fields))  # what crosses the socket
    endpoints, records, invalid = _changes("db", old, message)
    snapshot = old.updated(invalid, endpoints=endpoints)
    return snapshot.updated(invalid, metrics=records)


@settings(max_examples=200)
@given(
    start=st.dictionaries(
        st.sampled_from(NAMES), st.tuples(st.sampled_from(["up", "down"]), st.integers(1, 2))
    ),
    batches=batches,
    invalid=st.lists(st.sets(st.sampled_from(PATHS)), min_size=8, max_size=8),
    whole_diff=st.booleans(),
)
def test_a_delta_applied_to_the_snapshot_before_gives_the_snapshot_after(
    start, batches, invalid, whole_diff
):
    instances = {name: bare(name, *state) for name, state in start.items()}
    records = {}
    snapshot = full_build(instances, records)
    for batch, bad in zip(batches, invalid, strict=False):
        names = set()
        for field, name, value in batch:
            current, make = (instances, bare) if field == "endpoints" else (records, metrics)
            if value is None:
                current.pop(name, None)
            else:
                current[name] = make(name, *value)
            names.add(name)
        new = full_build(instances, records, frozenset(bad))
        fields = changes.delta("db", snapshot, new, None if whole_diff else names)
        got = applied(snapshot, fields)
        assert got.endpoints == new.endpoints
        assert got.metrics == new.metrics
        assert got.invalid == new.invalid
        touched = set(fields.get("instances", ())) | set(fields.get("metrics", ()))
        assert touched <= names  # only what changed travels
        snapshot = got


def test_a_spec_change_is_not_a_delta_and_no_change_is_an_empty_one():
    old = full_build({"p1:a": bare("p1:a", "up", 1)}, {})
    assert changes.delta("db", old, old, None) == {}
    other = old.rebuilt(spec=ServiceSpec("db", scheme="postgresql"))
    assert changes.delta("db", old, other, None) is None


def test_a_changes_frame_does_not_grow_with_the_service():
    def frame(size: int) -> bytes:
        instances = {f"p1:r{i:05d}": bare(f"p1:r{i:05d}", "up", 1) for i in range(size)}
        old = full_build(instances, {"p1:r00000": metrics("p1:r00000", 0)})
        new = old.updated(old.invalid, metrics={"p1:r00000": metrics("p1:r00000", 1)})
        fields = changes.delta("db", old, new, {"p1:r00000"})
        return protocol.encode({"op": "delta", "service": "db", "seq": 7, **fields})

    assert len(frame(10)) == len(frame(10_000))


def test_a_connections_deltas_collapse_into_the_whole_state_past_the_bound():
    pending = Pending()
    for seq in range(1, changes.MAX_PENDING_DELTAS + 1):
        pending.add_delta("db", seq, b"x")
    assert len(pending.deltas["db"]) == changes.MAX_PENDING_DELTAS and not pending.whole
    pending.add_delta("db", changes.MAX_PENDING_DELTAS + 1, b"x")
    assert pending.whole == {"db"} and not pending.deltas and pending.collapsed == 1
    pending.add_delta("db", changes.MAX_PENDING_DELTAS + 2, b"x")  # the state will hold it
    assert not pending.deltas
    big = Pending()
    big.add_delta("db", 1, b"x" * (changes.MAX_PENDING_DELTA_BYTES + 1))
    assert big.whole == {"db"}
    _, whole, _ = pending.take()
    assert whole == {"db"} and not pending


def test_a_frame_with_fields_encoded_once_is_the_frame_of_the_whole_message():
    entry = {"spec": "{}", "instances": {"p1:é": [1, "{}"]}, "metrics": {}}
    message = {"op": "service", "id": None, "seq": 3}
    shared = protocol.encode(message, {"entry": protocol.encode(entry)[4:]})
    assert shared == protocol.encode({**message, "entry": entry})
