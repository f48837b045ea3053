"""Sentinel's model in xDS terms: the resources the agent's xDS server serves of a service.

Pure functions from a cached :class:`~sentinel.cache.views.ServiceSnapshot` to the published
protocol messages (``xds-protos``); no I/O, no threads. The model
(``docs/decisions/xds-model.md``):

* a service is a **listener** of its own name (``xds:///orders-db``), whose route
  configuration is inline: an unsharded service's one route goes to the **cluster** of the
  service's name; a sharded service has one route per partition, matched on the request
  header :data:`PARTITION_HEADER`, to the cluster ``<service>/<partition>``, and no default
  route (a call without the header, or naming a partition with no instance, fails rather than
  reaching another partition's instances);
* a cluster is an EDS cluster (round robin across localities) whose **assignment** holds its
  instances: each instance is a locality of its own (``zone``: the instance's zone,
  ``sub_zone``: its name) weighted by the instance's weight, because gRPC honours locality
  weights and ignores endpoint weights under round robin; its status is the endpoint's health
  (``up``: HEALTHY; ``draining``: DRAINING; ``down``, ``starting``: UNHEALTHY), and gRPC
  sends calls to HEALTHY endpoints only;
* a cluster the agent's region has no eligible instance for is served, under the service's
  failover rule, with another region's instances (:mod:`sentinel.agent.xds_failover`), each
  a locality whose ``region`` names that region.

Nothing read from the registry is trusted: an instance whose host is not an IP address (gRPC's
EDS takes addresses only), or a resource larger than its bound, is skipped and counted
(:data:`~sentinel.telemetry.AGENT_XDS_SKIPPED`), never sent.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import api_listener_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.service.discovery.v3 import discovery_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import any_pb2, wrappers_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, status_pb2

from sentinel import telemetry
from sentinel.agent.served import partitions_of, scaled_weights
from sentinel.cache.views import ServiceSnapshot
from sentinel.errors import InvalidName
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.layout import validate_name

log = logging.getLogger(__name__)

LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
ENDPOINTS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
#: The resource types served, in the order a gRPC client asks for them.
TYPES = (LISTENER, ROUTE, CLUSTER, ENDPOINTS)

#: The request header naming the partition a call of a sharded service goes to.
PARTITION_HEADER = "x-sentinel-partition"
# Locality weights are integers: the heaviest instance of a cluster gets this many, the others
# in proportion (at least 1), so the sum of a cluster's weights stays far below 2**32.
WEIGHT_SCALE = 10_000
# Bounds on what one resource may hold: a listener names one route per partition, an
# assignment one locality per instance. gRPC clients take messages up to 4 MiB by default, and
# a listener response carries every listener a client follows (at most MAX_NAMES): within it.
MAX_LISTENER_BYTES = 64 * 1024
MAX_ASSIGNMENT_BYTES = 1024 * 1024

_HEALTH = {
    "up": health_check_pb2.HEALTHY,
    "draining": health_check_pb2.DRAINING,
    "down": health_check_pb2.UNHEALTHY,
    "starting": health_check_pb2.UNHEALTHY,
}
_ROUTER = hcm_pb2.HttpFilter(name="router")
_ROUTER.typed_config.Pack(router_pb2.Router())


@dataclass(frozen=True)
class Resources:
    """One service's resources, each packed and with the service's build number as version:
    ``listener`` (None: it would be over its bound), and by name, its ``clusters`` and its
    ``assignments`` (one over its bound is left out); ``oversized`` names what was left out."""

    listener: any_pb2.Any | None
    clusters: Mapping[str, any_pb2.Any] = field(default_factory=dict)
    assignments: Mapping[str, any_pb2.Any] = field(default_factory=dict)
    oversized: frozenset[str] = frozenset()  # the names left out for their size
    # Each instance's locality as encoded, by what it was encoded from: the next build of
    # the service encodes only the instances whose locality changed (see build()).
    localities: Mapping[tuple[object, ...], bytes] = field(
        default_factory=dict, repr=False, compare=False
    )
    # Each resource as it goes on the wire (see wire()), by type and name: encoded here,
    # once per change of the service, and shared by every stream sent it.
    _wire: dict[tuple[str, str], bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        wire = {(CLUSTER, n): encoded(r) for n, r in self.clusters.items()}
        wire.update({(ENDPOINTS, n): encoded(r) for n, r in self.assignments.items()})
        if self.listener is not None:
            wire[LISTENER, ""] = encoded(self.listener)
        object.__setattr__(self, "_wire", wire)

    def get(self, type_url: str, name: str) -> any_pb2.Any | None:
        """The resource of ``type_url`` named ``name``, None when this service has none."""
        if type_url == LISTENER:
            return self.listener
        if type_url == CLUSTER:
            return self.clusters.get(name)
        if type_url == ENDPOINTS:
            return self.assignments.get(name)
        return None

    def wire(self, type_url: str, name: str) -> bytes | None:
        """:meth:`get`'s resource :func:`encoded`, None when this service has none."""
        return self._wire.get((type_url, "" if type_url == LISTENER else name))


def cluster_name(service: str, partition: str | None) -> str:
    """The cluster of a service (``partition`` None: an unsharded one) or of one partition."""
    return service if partition is None else f"{service}/{partition}"


def service_of(name: str) -> str | None:
    """The service a listener or cluster name belongs to; None for a name Sentinel could
    not have made (a client's typo or garbage: it does not exist)."""
    service, _, partition = name.partition("/")
    try:
        validate_name("service", service)
        if partition:
            validate_name("partition", partition)
    except InvalidName:
        return None
    return service


def build(
    service: str,
    snapshot: ServiceSnapshot,
    elsewhere: Mapping[str | None, tuple[str, tuple[Endpoint, ...]]] | None = None,
    previous: Resources | None = None,
) -> Resources:
    """Every resource of ``service`` from its snapshot (see the module's documentation);
    ``elsewhere``: the partitions another region serves (its name and its instances there,
    each a locality of that region), by partition. ``previous``: the service's resources
    built last, whose localities are reused where nothing they were encoded from changed (a
    change of one instance of 10,000 encodes one locality, not 10,000)."""
    sharded = snapshot.spec.shard_policy is not None
    partitions = partitions_of(snapshot)
    elsewhere = elsewhere or {}
    names = [cluster_name(service, p) for p in partitions]
    listener = _pack(_listener(service, sharded, partitions, names), MAX_LISTENER_BYTES, service)
    clusters = {name: _pack(_cluster(name)) for name in names}
    assignments = {}
    oversized = set() if listener is not None else {service}
    known = previous.localities if previous is not None else {}
    localities: dict[tuple[object, ...], bytes] = {}
    for partition, name in zip(partitions, names, strict=True):
        region, instances = elsewhere.get(partition, ("", snapshot.partitions.get(partition, ())))
        assignment = _assignment(name, instances, region, known, localities)
        packed = _packed(ENDPOINTS, assignment, MAX_ASSIGNMENT_BYTES, name)
        if packed is None:
            oversized.add(name)
        else:
            assignments[name] = packed
    return Resources(listener, clusters, assignments, frozenset(oversized), localities)


def _listener(
    service: str, sharded: bool, partitions: list[str | None], clusters: list[str]
) -> listener_pb2.Listener:
    routes = []
    for partition, cluster in zip(partitions, clusters, strict=True):
        match = route_components_pb2.RouteMatch(prefix="")
        if sharded:
            match.headers.append(
                route_components_pb2.HeaderMatcher(
                    name=PARTITION_HEADER, string_match=string_pb2.StringMatcher(exact=partition)
                )
            )
        routes.append(
            route_components_pb2.Route(
                match=match, route=route_components_pb2.RouteAction(cluster=cluster)
            )
        )
    manager = hcm_pb2.HttpConnectionManager(
        route_config=route_pb2.RouteConfiguration(
            name=service,
            virtual_hosts=[
                route_components_pb2.VirtualHost(name=service, domains=["*"], routes=routes)
            ],
        ),
        http_filters=[_ROUTER],
    )
    listener = listener_pb2.Listener(name=service, api_listener=api_listener_pb2.ApiListener())
    listener.api_listener.api_listener.Pack(manager)
    return listener


def _cluster(name: str) -> cluster_pb2.Cluster:
    return cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.EDS,
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(
            eds_config=config_source_pb2.ConfigSource(
                ads=config_source_pb2.AggregatedConfigSource(),
                resource_api_version=config_source_pb2.V3,
            ),
            service_name=name,
        ),
        lb_policy=cluster_pb2.Cluster.ROUND_ROBIN,
        # Envoy weighs localities only when asked; gRPC always does.
        common_lb_config=cluster_pb2.Cluster.CommonLbConfig(
            locality_weighted_lb_config=cluster_pb2.Cluster.CommonLbConfig.LocalityWeightedLbConfig()
        ),
    )


def _assignment(
    name: str,
    instances: tuple[Endpoint, ...],
    region: str,
    known: Mapping[tuple[object, ...], bytes],
    localities: dict[tuple[object, ...], bytes],
) -> bytes:
    """The serialized ClusterLoadAssignment of ``instances``: its name's bytes followed by
    each locality's (protobuf appends concatenated repeated fields), taken from ``known``
    where it holds one encoded from the same values, else encoded; each put in
    ``localities``."""
    weights = locality_weights(tuple(i for i in instances if i.status == "up"))
    pieces = [endpoint_pb2.ClusterLoadAssignment(cluster_name=name).SerializeToString()]
    for instance in instances:
        # An instance that is not up has no weight: gRPC sends it nothing for its health.
        weight = weights.get(instance.name) if instance.status == "up" else 1
        key = (region, instance.zone, instance.name, instance.host, instance.port)
        key += (instance.status, weight)
        encoded = known.get(key)
        if encoded is None:
            address = _address(instance.host)
            if address is None:
                log.warning(
                    "xDS: %s of %s skipped: its host is not an IP address", instance.name, name
                )
                telemetry.AGENT_XDS_SKIPPED.labels("address").inc()
                continue
            if weight is None:  # weight 0 beside heavier instances: never picked
                continue
            encoded = _locality(instance, address, weight, region)
        localities[key] = encoded
        pieces.append(encoded)
    return b"".join(pieces)


def _locality(instance: Endpoint, address: str, weight: int, region: str) -> bytes:
    """``instance`` as one locality of its own, as an entry of an assignment's
    ``endpoints``."""
    endpoint = endpoint_components_pb2.LbEndpoint(
        endpoint=endpoint_components_pb2.Endpoint(
            address=address_pb2.Address(
                socket_address=address_pb2.SocketAddress(address=address, port_value=instance.port)
            )
        ),
        health_status=_HEALTH.get(instance.status, health_check_pb2.UNHEALTHY),
    )
    locality = endpoint_components_pb2.LocalityLbEndpoints(
        locality=base_pb2.Locality(region=region, zone=instance.zone or "", sub_zone=instance.name),
        lb_endpoints=[endpoint],
        load_balancing_weight=wrappers_pb2.UInt32Value(value=weight),
    )
    return endpoint_pb2.ClusterLoadAssignment(endpoints=[locality]).SerializeToString()


def locality_weights(instances: tuple[Endpoint, ...]) -> dict[str, int]:
    """Each instance's locality weight by its name (:func:`~sentinel.agent.served.scaled_weights`
    with the heaviest at :data:`WEIGHT_SCALE`)."""
    return scaled_weights(instances, WEIGHT_SCALE)


def _address(host: str) -> str | None:
    """``host`` as gRPC's EDS takes it (an IP address, no brackets, no zone index), or None."""
    try:
        address = str(ipaddress.ip_address(host.removeprefix("[").removesuffix("]")))
    except ValueError:
        return None
    return None if "%" in address else address


def _pack(message: Message, bound: int | None = None, name: str = "") -> any_pb2.Any | None:
    type_url = f"type.googleapis.com/{message.DESCRIPTOR.full_name}"
    return _packed(type_url, message.SerializeToString(), bound, name)


def _packed(
    type_url: str, value: bytes, bound: int | None = None, name: str = ""
) -> any_pb2.Any | None:
    packed = any_pb2.Any(type_url=type_url, value=value)
    if bound is not None and packed.ByteSize() > bound:
        log.warning(
            "xDS: %s skipped: %d bytes, over the bound of %d", name, packed.ByteSize(), bound
        )
        telemetry.AGENT_XDS_SKIPPED.labels("size").inc()
        return None
    return packed


def encoded(packed: any_pb2.Any) -> bytes:
    """``packed`` as one entry of a DiscoveryResponse's ``resources``, in protobuf's wire
    format: a response is its other fields' bytes followed by such entries (protobuf merges
    concatenated messages, appending to repeated fields), so that an assignment of 10,000
    instances is serialized once per change, not once per stream (``docs/grpc.md``)."""
    return discovery_pb2.DiscoveryResponse(resources=[packed]).SerializeToString()


def not_found(name: str) -> discovery_pb2.ResourceError:
    """The per-resource error (xRFC TP3) that tells a client ``name`` does not exist. A
    listener or cluster left out of a State of the World response does not exist, but a
    client never sent it waits out its resource timer (15 s) before it believes so; a client
    that reads this error fails the name's calls at once (gRPC's C core, grpcio among its
    wrappers, with ``GRPC_EXPERIMENTAL_XDS_DATA_ERROR_HANDLING=true``)."""
    return discovery_pb2.ResourceError(
        resource_name=discovery_pb2.ResourceName(name=name),
        error_detail=status_pb2.Status(
            code=code_pb2.NOT_FOUND,
            message=f"the agent serves no {name!r}: no such service (or partition), "
            "or not everyone may read it",
        ),
    )
