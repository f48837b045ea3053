"""The dashboard without a server: its view models (:mod:`sentinel.ui.views`), its change
fan-out (:mod:`sentinel.ui.live`) and its origin checks (:mod:`sentinel.ui.security`)."""

from __future__ import annotations

import asyncio
import json

from sentinel.registry.dependencies import DependencyGraph
from sentinel.registry.records import ClientRecord
from sentinel.ui import live, views
from sentinel.ui.security import Tokens, allowed_hosts, same_origin


def test_a_property_named_like_a_secret_is_never_shown():
    shown = dict(
        views.shown_properties(
            {"password": "p", "db_passwd": "p", "API_KEY": "k", "auth_token": "t", "tier": "web"}
        )
    )
    assert shown == {
        "password": "***",
        "db_passwd": "***",
        "API_KEY": "***",
        "auth_token": "***",
        "tier": "web",
    }


def test_failing_services_are_the_unreadable_the_empty_and_the_partly_down():
    rows = {
        "ok": views.ServiceRow("ok", instances=2, up=2),
        "empty": views.ServiceRow("empty"),
        "partly": views.ServiceRow("partly", instances=2, up=1),
        "unserved": views.ServiceRow("unserved", instances=1, up=1, unserved=("p2",)),
        "secret": views.ServiceRow("secret", unreadable="no access"),
    }
    assert [name for name, row in rows.items() if row.failing] == [
        "empty",
        "partly",
        "unserved",
        "secret",
    ]
    listing = views.services_view(["b", "a"], {}, {}, {"a": "no access"}, failing_only=True)
    assert [row.name for row in listing.rows] == ["a", "b"]  # not loaded is failing too
    assert listing.rows[0].unreadable == "no access" and listing.rows[1].unreadable


def test_followers_count_live_processes_only():
    records = {
        "a": ClientRecord("svc", "a"),
        "b": ClientRecord("svc", "b", left=1.0),
    }
    assert views.live_followers(records) == 1
    hosts = views.hosts_view({"svc": {**records, "c": ClientRecord("svc", "c", host="h", pid=7)}})
    assert [(h.host, h.processes) for h in hosts] == [
        ("-", (("-", "a", ("svc",)),)),
        ("h", (("7", "c", ("svc",)),)),
    ]


def test_the_topology_colours_each_edge_by_its_targets_health():
    graph = DependencyGraph.from_clients(
        {
            "db": {"w1": ClientRecord("db", "w1", app="web")},
            "cache": {"w1": ClientRecord("cache", "w1", app="web")},
            "web": {"x": ClientRecord("web", "x", app="edge")},
        }
    )
    rows = {
        "db": views.ServiceRow("db", instances=1, up=0),
        "cache": views.ServiceRow("cache", instances=1, up=1),
    }
    view = views.topology_view(graph, rows)
    assert {(e.source, e.target, e.health) for e in view.edges} == {
        ("web", "db", "failing"),
        ("web", "cache", "ok"),
        ("edge", "web", "unknown"),
    }
    dot = views.topology_dot(view)
    assert '"web" -> "db" [color="#c62828"' in dot
    assert '"web" -> "cache" [color="#2e7d32"' in dot


def test_a_viewer_too_slow_to_read_is_dropped_and_the_others_served():
    async def run() -> tuple[list[str], list[str], int]:
        feed = live.ChangeFeed(max_streams=2)
        feed.bind(asyncio.get_running_loop())
        slow, quick = feed.open(), feed.open()
        assert slow is not None and quick is not None
        assert feed.open() is None  # the cap
        slow_events, quick_events = feed.events(slow), feed.events(quick)
        assert (await anext(slow_events)).startswith("retry:")
        assert (await anext(quick_events)).startswith("retry:")
        received = []
        for _ in range(live.QUEUE_SIZE + 1):  # one more than the slow viewer's queue holds
            feed.publish("svc", "InstancesChanged")
            await asyncio.sleep(0)  # the loop runs the fan-out
            received.append(await anext(quick_events))
        ended = [item async for item in slow_events]  # its stream ends: nothing more
        return received, ended, feed.open_streams

    received, ended, still_open = asyncio.run(run())
    assert ended == []
    assert still_open == 1
    versions = [json.loads(item.split("data: ")[1])["version"] for item in received]
    assert versions == list(range(1, live.QUEUE_SIZE + 2))


def test_only_this_origin_with_its_sessions_token_may_act():
    tokens = Tokens()
    session = tokens.new_session()
    assert tokens.valid(session, tokens.token(session))
    assert not tokens.valid(session, tokens.token(tokens.new_session()))
    assert not tokens.valid(None, tokens.token(session))
    assert not tokens.valid(session, None)
    assert not Tokens().valid(session, tokens.token(session))  # another process's key
    origin = "http://127.0.0.1:8470"
    assert same_origin({"origin": origin}, origin)
    assert not same_origin({"origin": "http://127.0.0.1.evil.example:8470"}, origin)
    assert not same_origin({"origin": "null"}, origin)
    assert same_origin({"sec-fetch-site": "same-origin"}, origin)
    assert not same_origin({"sec-fetch-site": "same-site"}, origin)
    assert not same_origin({}, origin)


def test_the_hosts_a_dashboard_answers_to():
    assert allowed_hosts("127.0.0.1", 8470) == {"127.0.0.1:8470", "localhost:8470"}
    assert allowed_hosts("::1", 80) == {"[::1]:80", "localhost:80"}
    assert allowed_hosts("10.0.0.5", 80, ["Ops.example"]) == {"10.0.0.5:80", "ops.example:80"}
