"""What a write costs the publisher, counted by the server: the requests its session sent.

ZooKeeper's ``cons`` command reports, per connection, how many packets the server received
(``recved``) under the session id; the difference around one call is that call's requests.
Pings count too (kazoo sends one when the session has been quiet for a third of its
timeout), so each figure is the fewest of a few tries: a ping lands in one try, not in all.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest

from sentinel import Sentinel
from sentinel.testing.zookeeper import LocalZooKeeper, four_letter_word

pytestmark = pytest.mark.integration

TRIES = 5


def received(zookeeper: LocalZooKeeper, client: Sentinel) -> int:
    """Packets the server has received on ``client``'s session so far."""
    session = f"sid=0x{client.session_id:x},"
    for member in zookeeper.members:
        for line in four_letter_word("127.0.0.1", member.client_port, "cons").splitlines():
            if session in line:
                match = re.search(r"recved=(\d+)", line)
                assert match, line
                return int(match.group(1))
    raise AssertionError(f"no connection of session {client.session_id:x} on the server")


def settled(zookeeper: LocalZooKeeper, client: Sentinel) -> int:
    """The session's count once it has stayed the same for 0.3 s (what a call left running in
    the background has sent too), polled for at most 5 s."""
    last, since = received(zookeeper, client), time.monotonic()
    deadline = since + 5
    while time.monotonic() < deadline:
        time.sleep(0.05)  # polling the server's counter; there is no event to wait on
        now = received(zookeeper, client)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 0.3:
            return now
    raise AssertionError("the session never went quiet")


def requests_of(zookeeper: LocalZooKeeper, client: Sentinel, call: Callable[[int], None]) -> int:
    """The fewest requests ``call(try)`` sent in TRIES tries, its background work included."""
    counts = []
    for attempt in range(TRIES):
        before = settled(zookeeper, client)
        call(attempt)
        counts.append(settled(zookeeper, client) - before)
    return min(counts)


def test_register_update_metrics_and_deregister_pay_their_round_trips_and_nothing_else(
    zookeeper, make_client
):
    publisher = make_client("publisher", announce=False)
    first = publisher.register("db", "p1", "10.0.0.1", 5432, label="first")
    # The service exists and this client has published to it: the steady state.
    publisher.update_metrics(first, {"replication_lag": 0.5})
    registrations = {}

    def register(attempt: int) -> None:
        registrations[attempt] = publisher.register(
            "db", "p1", "10.0.0.2", 6000 + attempt, label=f"r{attempt}"
        )

    def update(attempt: int) -> None:
        publisher.update_metrics(first, {"replication_lag": attempt})

    def deregister(attempt: int) -> None:
        assert publisher.deregister(registrations[attempt])

    # The create, which register waits for, and nothing else on its path; then, in
    # the background, one read that sets a watch on the new node, so that its process keeps a
    # status an operator writes there (`sentinel drain`) across its own updates and expiries.
    assert requests_of(zookeeper, publisher, register) == 2
    assert requests_of(zookeeper, publisher, update) == 1  # the set (its node exists)
    # The delete, conditional on the version the node's watch last read: that watch (the one
    # register set) says whether the node is still this session's own, so no read is sent.
    assert requests_of(zookeeper, publisher, deregister) == 1


def test_the_count_sees_an_extra_request(zookeeper, make_client):
    """The control: a call that adds one read is counted as two requests."""
    publisher = make_client("publisher", announce=False)
    registration = publisher.register("db", "p1", "10.0.0.1", 5432, label="a")
    publisher.update_metrics(registration, {"replication_lag": 0.5})

    def update_and_read(attempt: int) -> None:
        publisher.update_metrics(registration, {"replication_lag": attempt})
        publisher.session.zk.exists("/metrics/db")

    assert requests_of(zookeeper, publisher, update_and_read) == 2


def test_a_status_change_is_one_set(zookeeper, make_client):
    """``update_registration`` (and a readiness check's status write, the same path) of a
    node whose watch knows it is this session's: the conditional set, then in the background
    the read that sets its next watch; not a create that fails first."""
    publisher = make_client("publisher", announce=False)
    registration = publisher.register("db", "p1", "10.0.0.1", 5432, label="a")

    def update(attempt: int) -> None:
        publisher.update_registration(registration, status="down" if attempt % 2 else "up")

    assert requests_of(zookeeper, publisher, update) == 2
