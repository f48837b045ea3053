"""Passive ejection across regions (issue 50, item 6): a client that fails over shares its
feedback with its clients of the other regions, so an instance there bearing the same
(service, partition, label) as a local one must not take the local one's place in it.

Two real ensembles: the session's server is ``east`` (this client's region), ``west`` one
server of this module's.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sentinel import Sentinel
from sentinel.regions import Failover, Region, Regions
from sentinel.testing.helpers import wait_until
from sentinel.testing.zookeeper import LocalZooKeeper

pytestmark = pytest.mark.integration

SERVICE = "orders"


@pytest.fixture(scope="module")
def west() -> Iterator[LocalZooKeeper]:
    with LocalZooKeeper() as zk:
        yield zk


def test_one_regions_failures_never_eject_another_regions_instance_of_the_same_name(
    zookeeper, west, namespace
):
    """West's ``p1:a`` fails until it is ejected; east's ``p1:a`` (another address) is
    served all the same once it is up, and is not reported down."""
    regions = Regions(
        "east",
        [
            Region("east", zookeeper.connect_string, namespace=namespace),
            Region("west", west.connect_string, namespace=namespace),
        ],
    )
    rule = Failover(regions=("west",), return_after=0.2)
    with (
        Sentinel(zookeeper.connect_string, "east-pub", namespace, announce=False) as east_pub,
        Sentinel(west.connect_string, "west-pub", namespace, announce=False) as west_pub,
        Sentinel(
            namespace=namespace, client_id="app", regions=regions, prometheus_registry=None
        ) as client,
    ):
        east_pub.ensure_service(SERVICE, failover=rule)
        west_pub.ensure_service(SERVICE)
        west_pub.register(SERVICE, "p1", "10.0.2.1", 8080, label="a")
        # Nothing in east: the lookup fails over, and west's `a` fails until it is ejected.
        remote = client.get_service(SERVICE)
        assert (remote.host, remote.label) == ("10.0.2.1", "a")
        for _ in range(client.feedback.detection.consecutive_failures):
            client.report(remote, ok=False)
        assert client.feedback.is_down(remote)
        east_pub.register(SERVICE, "p1", "10.0.1.1", 8080, label="a")
        east_pub.register(SERVICE, "p1", "10.0.1.2", 8080, label="b")
        assert wait_until(lambda: len(client.cached_instances(SERVICE)) == 2)
        (local_a,) = [e for e in client.cached_instances(SERVICE) if e.label == "a"]
        assert not client.feedback.is_down(local_a)
        # Back home once east is eligible, and east's `a` is among what lookups choose from
        # (round robin over two instances): west's failures are west's.
        served = lambda: {client.get_service(SERVICE).host for _ in range(8)}  # noqa: E731
        assert wait_until(lambda: served() == {"10.0.1.1", "10.0.1.2"}), served()
