"""Cluster views after Sling: stable order, stable leader, events with old and new views."""

import pytest

from sentinel.errors import ConnectionInterrupted
from sentinel.testing.helpers import expire_session, wait_until
from sentinel.topology import ClusterView, Topology, TopologyEventType
from tests.integration.recorder import Recorder

pytestmark = pytest.mark.integration


def labels(view):
    return [m.label for m in view.members]


def join(make_client, label, **properties):
    member = make_client(f"member-{label}")
    return member, member.register(
        "managers", "p", f"10.0.0.{len(label)}", 80, label=label, properties=properties
    )


def test_order_and_leader_are_stable_across_joins_and_leaves(make_client):
    members = {label: join(make_client, label) for label in ("a", "b", "c")}
    observer = make_client("observer")
    topology = Topology(observer, "managers")
    assert labels(topology.view) == ["a", "b", "c"] and topology.view.leader.label == "a"
    events = Recorder()
    topology.add_listener(events)
    (init,) = events.wait_for(1)
    assert init.type is TopologyEventType.TOPOLOGY_INIT and labels(init.new_view) == ["a", "b", "c"]

    members["d"] = join(make_client, "d")  # a newcomer goes to the end; the leader stays
    changing, changed = events.wait_for(3)[1:]
    assert changing.type is TopologyEventType.TOPOLOGY_CHANGING and changing.new_view is None
    assert changed.type is TopologyEventType.TOPOLOGY_CHANGED
    assert labels(changed.old_view) == ["a", "b", "c"]
    assert labels(changed.new_view) == ["a", "b", "c", "d"]
    assert changed.new_view.leader.label == "a" and changed.new_view.id != changed.old_view.id

    members["b"][0].close()  # a follower leaves: the others keep their order
    assert labels(events.wait_for(5)[4].new_view) == ["a", "c", "d"]

    leader_client, leader_registration = members["a"]
    assert topology.view.leader_is(leader_registration)
    leader_client.close()  # the leader leaves: the next in order leads
    after = events.wait_for(7)[6]
    assert labels(after.new_view) == ["c", "d"] and after.new_view.leader.label == "c"
    assert not after.new_view.leader_is(leader_registration)
    assert [e.type for e in events.events] == [
        TopologyEventType.TOPOLOGY_INIT,
        *[TopologyEventType.TOPOLOGY_CHANGING, TopologyEventType.TOPOLOGY_CHANGED] * 3,
    ]


def test_properties_change_keeps_the_view_id_and_the_place(make_client):
    first, _ = join(make_client, "a", load=1)
    join(make_client, "b")
    topology = Topology(make_client("observer"), "managers")
    events = Recorder()
    topology.add_listener(events)
    events.wait_for(1)
    before = topology.view
    first.register("managers", "p", "10.0.0.1", 80, label="a", properties={"load": 7})
    (changed,) = events.wait_for(2)[1:]
    assert changed.type is TopologyEventType.PROPERTIES_CHANGED
    assert changed.old_view.members[0].properties == {"load": 1}
    assert changed.new_view.members[0].properties == {"load": 7}
    assert changed.new_view.id == before.id and labels(changed.new_view) == ["a", "b"]
    # Metrics are not properties, and an unchanged registration is no change: neither raises
    # an event. Events arrive in order, so the join that follows fences anything spurious.
    first.update_metrics("managers", "p", "a", {"queue": 3})
    first.register("managers", "p", "10.0.0.1", 80, label="a", properties={"load": 7})
    join(make_client, "c")
    assert [e.type for e in events.wait_for(4)[2:]] == [
        TopologyEventType.TOPOLOGY_CHANGING,
        TopologyEventType.TOPOLOGY_CHANGED,
    ]


def test_a_leader_whose_session_expires_rejoins_at_the_end(make_client):
    leader, _ = join(make_client, "a")
    join(make_client, "b")
    topology = Topology(make_client("observer"), "managers")
    assert topology.view.leader.label == "a"
    expire_session(leader)

    def rejoined():
        return labels(topology.view) == ["b", "a"]

    assert wait_until(rejoined, timeout=15, ignore=(ConnectionInterrupted,))
    assert topology.view.leader.label == "b"


def test_views_know_positions_and_empty_views_have_no_leader(make_client):
    join(make_client, "a")
    join(make_client, "b")
    view = Topology(make_client("observer"), "managers").view
    assert (view.position("p:a"), view.position("p:b"), view.position("p:z")) == (0, 1, None)
    empty = ClusterView("nothing", ())
    assert empty.leader is None and empty.id == ClusterView("other", ()).id


def test_a_failing_listener_does_not_stop_the_others(make_client):
    join(make_client, "a")
    topology = Topology(make_client("observer"), "managers")
    events = Recorder()
    topology.add_listener(lambda event: 1 / 0)
    topology.add_listener(events)
    join(make_client, "b")
    assert events.wait_for(3)[2].type is TopologyEventType.TOPOLOGY_CHANGED


def test_update_registration_publishes_properties_in_place(make_client, raw_zk):
    member, registration = join(make_client, "a", load=1)
    join(make_client, "b")
    topology = Topology(make_client("observer"), "managers")
    events = Recorder()
    topology.add_listener(events)
    _, before = raw_zk.get(registration.path)
    updated = member.update_registration(registration, properties={"load": 9}, status="draining")
    (changed,) = events.wait_for(2)[1:]
    assert changed.type is TopologyEventType.PROPERTIES_CHANGED
    assert changed.new_view.members[0].properties == {"load": 9}
    assert changed.new_view.members[0].status == "draining"
    assert labels(changed.new_view) == ["a", "b"]
    _, after = raw_zk.get(registration.path)
    assert after.czxid == before.czxid and updated.instance.status == "draining"
    from sentinel.errors import ValidationError

    with pytest.raises(ValidationError, match="only"):
        member.update_registration(registration, port=1)
    with pytest.raises(ValidationError):
        member.update_registration(registration, status="asleep")
