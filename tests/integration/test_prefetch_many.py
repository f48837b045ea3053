"""``prefetch(*services)``: many services load together, a few requests per batch rather than
several round trips per service, and stay exact under changes made while they load (every
watch is in place before any read is sent)."""

import random
import re
import threading

import pytest

from sentinel.errors import ServiceNotFound
from sentinel.testing.helpers import cached_view, registry_view, wait_until
from sentinel.testing.zookeeper import four_letter_word

pytestmark = pytest.mark.integration

# Two worker tasks' worth (LOADS_IN_FLIGHT is 64), and one name that is not registered.
SERVICES = [f"svc{i}" for i in range(100)]
MISSING = "svc-missing"


def received_by(zookeeper, client) -> int:
    """The requests the server has received on ``client``'s session (``cons``)."""
    session = f"sid=0x{client.session.zk.client_id[0]:x}"
    connections = four_letter_word("127.0.0.1", zookeeper.members[0].client_port, "cons", 5)
    (line,) = [line for line in connections.splitlines() if session in line]
    return int(re.search(r"recved=(\d+)", line).group(1))


def test_many_services_load_together_and_exact_under_changes(zookeeper, make_client):
    writer = make_client("writer", announce=False)
    for i, service in enumerate(SERVICES):
        writer.ensure_service(service)
        writer.register(service, "p1", f"10.0.{i // 250}.{i % 250}", 80, label="a")
    writer.update_metrics(SERVICES[0], "p1", "a", {"lag": 1})
    reader = make_client("reader", announce=False)
    reader.get_service(SERVICES[0])  # the session's one-off requests (follower, mode) made

    # Quiet: two watches a service, sent together, and a few multi-reads for them all. One at
    # a time, a service is two watches and four reads (a spec, two listings, a multi-read).
    quiet = SERVICES[1:51]
    before = received_by(zookeeper, reader)
    with pytest.raises(ServiceNotFound):
        reader.prefetch(*quiet[:30], MISSING, *quiet[30:])
    received = received_by(zookeeper, reader) - before
    assert all(service in reader.session.cache.snapshots for service in quiet)
    assert MISSING not in reader.session.cache.snapshots
    assert received <= 2 * len(quiet) + 12, f"{received} requests for {len(quiet)} services"

    # Under changes: a writer registers, reweights, deregisters and publishes metrics in the
    # services while the reader loads them; what it wrote must reach the cache.
    stop, rng = threading.Event(), random.Random(7)

    def churn():
        count = 0
        while not stop.is_set() or count < 30:
            service, count = rng.choice(SERVICES[51:]), count + 1
            label, weight = f"c{count}", rng.randint(1, 9)
            registration = writer.register(
                service, "p1", "10.1.0.1", 81, label=label, weight=weight
            )
            if count % 3 == 0:
                writer.deregister(registration)
            if count % 5 == 0:
                writer.update_metrics(service, "p1", "a", {"lag": count})

    changing = threading.Thread(target=churn)
    changing.start()
    try:
        reader.prefetch(*SERVICES[51:])
    finally:
        stop.set()
        changing.join()
    assert wait_until(
        lambda: all(cached_view(reader, s) == registry_view(writer, s) for s in SERVICES)
    ), [s for s in SERVICES if cached_view(reader, s) != registry_view(writer, s)]
