"""Sentinel's model in xDS terms, on values alone: the resources built from a snapshot, the
bounds and the skips, and the addresses and bootstrap of ``--xds``."""

from __future__ import annotations

import dataclasses
import json

import pytest
from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.service.discovery.v3 import discovery_pb2

from sentinel.agent import xds_resources
from sentinel.agent.xds_bootstrap import bootstrap, parse_address
from sentinel.agent.xds_resources import (
    CLUSTER,
    ENDPOINTS,
    LISTENER,
    PARTITION_HEADER,
    WEIGHT_SCALE,
    build,
    locality_weights,
    service_of,
)
from sentinel.cache.views import ServiceSnapshot
from sentinel.errors import ValidationError
from sentinel.registry.records import ServiceSpec
from tests.unit.endpoints import endpoint


def snapshot(*endpoints, shard_policy=None) -> ServiceSnapshot:
    spec = ServiceSpec("db", shard_policy=shard_policy)
    return ServiceSnapshot.first(spec, {e.name: e for e in endpoints}, {}, frozenset())


def at(e, host="127.0.0.1", port=5432):
    return dataclasses.replace(e, host=host, port=port)


def assignment(resources, name="db") -> endpoint_pb2.ClusterLoadAssignment:
    unpacked = endpoint_pb2.ClusterLoadAssignment()
    resources.get(ENDPOINTS, name).Unpack(unpacked)
    return unpacked


def routes(resources):
    listener = listener_pb2.Listener()
    resources.get(LISTENER, "db").Unpack(listener)
    manager = hcm_pb2.HttpConnectionManager()
    listener.api_listener.api_listener.Unpack(manager)
    return list(manager.route_config.virtual_hosts[0].routes)


def test_weights_scale_to_integers_with_the_heaviest_at_the_scale():
    weights = locality_weights((endpoint("a", weight=1), endpoint("b", weight=2.5)))
    assert weights == {"p1:a": WEIGHT_SCALE * 2 // 5, "p1:b": WEIGHT_SCALE}


def test_weight_zero_beside_heavier_ones_is_never_picked_and_all_zero_are_equal():
    assert locality_weights((endpoint("a", weight=0), endpoint("b", weight=3))) == {
        "p1:b": WEIGHT_SCALE
    }
    assert set(locality_weights((endpoint("a", weight=0), endpoint("b", weight=0))).values()) == {
        WEIGHT_SCALE
    }


def test_each_instance_is_a_locality_of_its_zone_weighted_and_its_status_is_its_health():
    built = build(
        "db",
        snapshot(
            at(endpoint("a", weight=1, zone="eu-1", partition="default"), port=1),
            at(endpoint("b", weight=4, partition="default", status="draining"), port=2),
            at(endpoint("c", weight=4, partition="default", status="down"), port=3),
            at(endpoint("d", weight=2, partition="default"), host="::1", port=4),
        ),
    )
    found = {
        locality.locality.sub_zone: (
            locality.locality.zone,
            locality.load_balancing_weight.value,
            locality.lb_endpoints[0].health_status,
            locality.lb_endpoints[0].endpoint.address.socket_address.address,
        )
        for locality in assignment(built).endpoints
    }
    assert found == {
        "default:a": ("eu-1", WEIGHT_SCALE // 2, health_check_pb2.HEALTHY, "127.0.0.1"),
        "default:b": ("", 1, health_check_pb2.DRAINING, "127.0.0.1"),
        "default:c": ("", 1, health_check_pb2.UNHEALTHY, "127.0.0.1"),
        "default:d": ("", WEIGHT_SCALE, health_check_pb2.HEALTHY, "::1"),
    }


def test_an_instance_whose_host_is_not_an_ip_address_is_left_out():
    built = build(
        "db",
        snapshot(
            at(endpoint("a", partition="x"), host="db.example"), at(endpoint("b", partition="x"))
        ),
    )
    assert [e.locality.sub_zone for e in assignment(built).endpoints] == ["x:b"]


def test_an_unsharded_service_is_one_route_to_its_own_cluster():
    built = build("db", snapshot(at(endpoint("a", partition="default"))))
    (route,) = routes(built)
    assert route.route.cluster == "db" and not route.match.headers
    assert set(built.clusters) == {"db"} and built.get(CLUSTER, "db") is not None


def test_a_sharded_service_routes_each_partition_by_its_header_and_has_no_default_route():
    built = build(
        "db",
        snapshot(
            at(endpoint("a", partition="p1")), at(endpoint("b", partition="p2")), shard_policy="t"
        ),
    )
    found = [
        (r.match.headers[0].name, r.match.headers[0].string_match.exact, r.route.cluster)
        for r in routes(built)
    ]
    assert found == [(PARTITION_HEADER, "p1", "db/p1"), (PARTITION_HEADER, "p2", "db/p2")]
    assert [e.locality.sub_zone for e in assignment(built, "db/p1").endpoints] == ["p1:a"]


def test_a_partition_served_elsewhere_holds_that_regions_instances_in_localities_of_it():
    """A partition with nothing eligible here, served by region b: its assignment holds b's
    instances (their localities naming b), in place of the home ones; the others are home's."""
    home = snapshot(
        at(endpoint("a", partition="p1")),
        at(endpoint("b", partition="p2", status="down")),
        shard_policy="t",
    )
    remote = at(endpoint("r", partition="p2"), host="10.0.2.1")
    built = build("db", home, {"p2": ("b", (remote,))})
    p2 = assignment(built, "db/p2").endpoints
    assert [(e.locality.region, e.locality.sub_zone) for e in p2] == [("b", "p2:r")]
    assert p2[0].lb_endpoints[0].endpoint.address.socket_address.address == "10.0.2.1"
    assert p2[0].lb_endpoints[0].health_status == health_check_pb2.HEALTHY
    p1 = assignment(built, "db/p1").endpoints
    assert [(e.locality.region, e.locality.sub_zone) for e in p1] == [("", "p1:a")]


def test_an_assignment_over_its_bound_is_left_out_and_named(monkeypatch):
    monkeypatch.setattr(xds_resources, "MAX_ASSIGNMENT_BYTES", 100)
    built = build("db", snapshot(*(at(endpoint(f"i{n}"), port=n + 1) for n in range(10))))
    assert built.get(ENDPOINTS, "db") is None and built.oversized == {"db"}


@pytest.mark.parametrize(
    ("name", "service"),
    [("db", "db"), ("db/p1", "db"), ("d b", None), ("db/p 1", None), ("", None), ("/p1", None)],
)
def test_a_name_no_service_could_have_belongs_to_none(name, service):
    assert service_of(name) == service


@pytest.mark.parametrize(
    ("address", "bind", "path"),
    [
        ("unix:/run/s/xds.sock", "unix:/run/s/xds.sock", "/run/s/xds.sock"),
        ("unix:///run/s/xds.sock", "unix:/run/s/xds.sock", "/run/s/xds.sock"),
        ("/run/s/xds.sock", "unix:/run/s/xds.sock", "/run/s/xds.sock"),
        ("127.0.0.1:18000", "127.0.0.1:18000", None),
        ("[::1]:18000", "[::1]:18000", None),
        ("localhost:0", "localhost:0", None),
    ],
)
def test_the_agent_serves_xds_on_a_unix_socket_or_loopback(address, bind, path):
    assert parse_address(address) == (bind, path)


@pytest.mark.parametrize(
    "address", ["0.0.0.0:18000", "10.0.0.1:18000", "[::]:18000", "example.com:80", "127.0.0.1"]
)
def test_an_address_beyond_the_host_is_refused(address):
    with pytest.raises(ValidationError, match="loopback"):
        parse_address(address)


def test_the_bootstrap_names_the_agent_in_plain_text_and_protocol_v3():
    document = bootstrap("unix:/run/sentinel/xds.sock", "web-1")
    json.dumps(document)
    (server,) = document["xds_servers"]
    assert server["server_uri"] == "unix:///run/sentinel/xds.sock"
    assert server["channel_creds"] == [{"type": "insecure"}]
    assert server["server_features"] == ["xds_v3"]
    assert document["node"] == {"id": "web-1", "locality": {}}
    assert bootstrap("127.0.0.1:18000", "n")["xds_servers"][0]["server_uri"] == "127.0.0.1:18000"


def test_a_response_of_shared_encoded_resources_reads_as_one_built_whole():
    """The agent sends a response as its own fields' bytes followed by each resource as
    encoded once per change (shared by every stream): a client reads the same message as
    one built with the resources in it, in order."""
    resources = build("db", snapshot(at(endpoint("a")), at(endpoint("b"), port=5433)))
    own = {"version_info": "7", "type_url": ENDPOINTS, "nonce": "3"}
    kinds = [(LISTENER, "db"), (CLUSTER, "db"), (ENDPOINTS, "db")]
    wire = discovery_pb2.DiscoveryResponse(**own).SerializeToString() + b"".join(
        resources.wire(*kind) for kind in kinds
    )
    whole = discovery_pb2.DiscoveryResponse(**own, resources=[resources.get(*k) for k in kinds])
    assert discovery_pb2.DiscoveryResponse.FromString(wire) == whole
    assert resources.wire(ENDPOINTS, "db") is resources.wire(ENDPOINTS, "db")  # encoded once
    assert resources.wire(ENDPOINTS, "other") is None


def test_a_build_after_a_change_reuses_the_localities_nothing_changed_and_equals_a_fresh_one():
    """The agent builds a service's resources again at each change, given the last build:
    one instance drained encodes that one locality (the others' bytes are the same objects),
    and the assignment is the one a build from nothing makes; an instance made the heaviest
    re-weights every other locality."""
    hosts = [at(endpoint(f"r{i}"), host=f"10.0.0.{i}") for i in range(1, 6)]
    first = build("db", snapshot(*hosts))
    drained = [dataclasses.replace(hosts[0], status="draining"), *hosts[1:]]
    again = build("db", snapshot(*drained), previous=first)
    assert again.get(ENDPOINTS, "db") == build("db", snapshot(*drained)).get(ENDPOINTS, "db")
    assert assignment(again).endpoints[0].lb_endpoints[0].health_status == (
        health_check_pb2.DRAINING
    )
    kept = {k: v for k, v in again.localities.items() if k[2] != "p1:r1"}
    assert len(kept) == 4
    assert all(first.localities[k] is v for k, v in kept.items())
    heavier = [dataclasses.replace(hosts[0], weight=2), *hosts[1:]]
    reweighted = build("db", snapshot(*heavier), previous=first)
    assert reweighted.get(ENDPOINTS, "db") == build("db", snapshot(*heavier)).get(ENDPOINTS, "db")
    # Its own locality keeps the scale's weight; every other one is encoded anew.
    assert [k[2] for k in set(reweighted.localities) & set(first.localities)] == ["p1:r1"]
    weights = [e.load_balancing_weight.value for e in assignment(reweighted).endpoints]
    assert weights == [WEIGHT_SCALE] + [WEIGHT_SCALE // 2] * 4
