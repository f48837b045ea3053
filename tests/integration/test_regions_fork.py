"""A client with other regions, forked (gunicorn ``--preload``, multiprocessing): the child's
regions work on sessions of its own, and its round-trip prober runs (none of the parent's
threads exist in a child). The three ensembles and helpers are test_regions_rule_change's."""

from __future__ import annotations

import math
import os
import threading

import pytest

from sentinel import Sentinel
from sentinel.errors import NoInstanceAvailable
from sentinel.regions import Failover, Region, Regions
from sentinel.regions import remotes as remotes_module
from sentinel.testing.helpers import TcpProxy, wait_until
from tests.integration.test_fork import _exit_code, _fork, _receive
from tests.integration.test_regions_rule_change import (  # noqa: F401  # fixtures
    answer,
    north,
    remote,
    west,
    world,
)

pytestmark = pytest.mark.integration

PROBE_INTERVAL = 0.2  # the prober's, for this test: a measurement is seen within seconds


def test_a_forked_childs_regions_are_its_own_and_measured_again(world, monkeypatch):  # noqa: F811
    monkeypatch.setattr(remotes_module, "RTT_INTERVAL", PROBE_INTERVAL)
    for publisher in world.publishers.values():
        publisher.ensure_service("orders", failover=Failover(nearest=1, regions=("west",)))
    world.register("west", "orders")
    with world.client() as client:
        assert answer(client, "orders") == "west"  # nearest: every region opened and measured
        parent = {name: remote(client, name).session.zk.client_id for name in ("west", "north")}

        def child(client, pipe) -> dict:
            remotes = client.regions_router.remotes
            west = remotes.by_name["west"]
            west.record(math.inf)  # unknown here: only a measurement in this process sets it
            region = answer(client, "orders")  # north ranked nearest (has none), then west
            return {
                "region": region,
                "prober": wait_until(
                    lambda: any(t.name == "sentinel-region-rtt" for t in threading.enumerate())
                )
                is not None,
                "measured": wait_until(lambda: not math.isinf(west.rtt), timeout=15) is not None,
                "sessions": {
                    name: remote(client, name).session.zk.client_id for name in ("west", "north")
                },
                "pid": remote(client, "west").session._pid == os.getpid(),
            }

        pid, pipe = _fork(client, child)
        result = _receive(pipe)
        assert _exit_code(pid) == 0
        assert result["region"] == "west"
        assert result["prober"], "the child's prober runs"
        assert result["measured"], "the child measures west's round trip again"
        assert result["pid"], "west's client was renewed in the child"
        assert result["sessions"]["west"] != parent["west"], "a session of the child's own"
        # the parent's regions are untouched by the child
        assert {n: remote(client, n).session.zk.client_id for n in parent} == parent
        assert answer(client, "orders") == "west"


def test_a_region_being_opened_at_the_fork_is_opened_again_in_the_child(world):  # noqa: F811
    world.publishers["east"].ensure_service("stock", failover=Failover(regions=("west",)))
    world.publishers["west"].ensure_service("stock")
    world.register("west", "stock")
    link = TcpProxy("127.0.0.1", int(world.ensembles["west"].connect_string.split(":")[1]))
    link.cut()  # west refuses: the parent's thread opening it keeps retrying through the fork
    regions = Regions(
        "east",
        [
            Region("east", world.ensembles["east"].connect_string, namespace=world.namespace),
            Region("west", link.address, namespace=world.namespace),
        ],
    )
    try:
        with Sentinel(
            namespace=world.namespace,
            client_id="east-app",
            regions=regions,
            connect_timeout=1.0,
            prometheus_registry=None,
        ).start() as client:
            with pytest.raises(NoInstanceAvailable, match="west: no connection"):
                client.get_service("stock")

            def child(client, pipe) -> dict:
                pipe.send({"forked": True})
                assert pipe.poll(30) and pipe.recv() == "restored"
                return {
                    "answered": wait_until(lambda: answer(client, "stock") == "west", timeout=15)
                    is not None
                }

            pid, pipe = _fork(client, child)
            assert _receive(pipe) == {"forked": True}
            link.restore()
            pipe.send("restored")
            assert _receive(pipe) == {"answered": True}, "west is opened in the child"
            assert _exit_code(pid) == 0
    finally:
        link.close()


def test_a_lock_held_at_the_fork_does_not_hold_the_childs_regions(world):  # noqa: F811
    world.publishers["east"].ensure_service("stock", failover=Failover(regions=("west",)))
    world.publishers["west"].ensure_service("stock")
    world.register("west", "stock")
    with world.client() as client:
        assert answer(client, "stock") == "west"
        router = client.regions_router
        remotes = router.remotes

        def child(client, pipe) -> dict:
            # each call takes one of the locks held in the parent at the fork: in a thread,
            # so that a lock still held here shows as a call that never returns
            calls = {
                "router": lambda: router.listen("stock", lambda event: None, "west")(),
                "remotes": lambda: remotes.open("north", wait=False),
            }
            returned = {}
            for name, call in calls.items():
                thread = threading.Thread(target=call, daemon=True)
                thread.start()
                thread.join(10)
                returned[name] = not thread.is_alive()
            return returned

        # held by this thread across the fork, as another thread's work in progress would be
        with router._changing, remotes._lock:
            pid, pipe = _fork(client, child)
        assert _receive(pipe) == {"router": True, "remotes": True}
        assert _exit_code(pid) == 0
