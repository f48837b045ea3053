"""Publishing in Apache Curator's x-discovery format, for the JVM clients of a ZooKeeper shop.

A :class:`CuratorPublisher` registers Python instances where Curator's ``ServiceProvider``,
Spring Cloud Zookeeper's ``DiscoveryClient`` and Dubbo 3 look: an ephemeral node
``<basePath>/<service>/<id>`` holding Curator's ``ServiceInstance`` JSON
(:func:`~sentinel.registry.curator.encode_instance`). The node lives as long as the
publisher's session, is re-created after a session expiry while the process lives
(:class:`~sentinel.zk.ephemeral.EphemeralNodes`), and goes at once on :meth:`close` or
:meth:`deregister`, and within the session timeout when the process dies::

    with CuratorPublisher("zk1:2181", base_path="/services") as publisher:
        publisher.register("orders", "10.0.0.5", 8080, uri_spec="{scheme}://{address}:{port}")

It holds a session of its own, rooted at the ensemble's root (a Sentinel client's session is
rooted at its namespace), opened by :meth:`start`. Nothing is written into a Sentinel
namespace.

This module is where every Curator name is imported from: the publisher, the namespace spec's
:class:`CuratorSource` (a Sentinel service whose instances live in a Curator registry) and
:func:`read_instances` (one read of a Curator service). They are defined beside the registry's
codecs (:mod:`sentinel.registry`), whose modules are not the public path.

A JVM reader is typed to one payload class for its whole base path (Spring Boot's
``DiscoveryClient`` to Spring Cloud's ``ZookeeperInstance``), and Curator fails its whole
query on an instance whose payload is of another class. So :meth:`CuratorPublisher.register`
writes the class the base path's instances carry (no payload into a Spring base path is an
empty :class:`SpringPayload`), and refuses any other with
:class:`~sentinel.errors.PayloadClassMismatch` naming the class and how to build it.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient

from sentinel.auth.acl import IDENTITY_ENV, WORLD_READ_CREATE, effective_identity, owner_acl
from sentinel.connection import client_arguments, start_client
from sentinel.devserver import resolve_hosts
from sentinel.errors import ClientClosed, PayloadClassMismatch, ValidationError
from sentinel.registry.curator import (
    CuratorInstance,
    encode_instance,
    parse_uri_spec,
    payload_class,
    payload_classes,
    read_instances,
)
from sentinel.registry.layout import validate_base_path, validate_name
from sentinel.registry.records import CuratorSource
from sentinel.zk.ephemeral import EphemeralNodes
from sentinel.zk.errors import translate_zk_errors
from sentinel.zk.tls import TlsConfig

__all__ = [
    "CuratorPublisher",
    "CuratorRegistration",
    "CuratorSource",
    "SpringPayload",
    "read_instances",
]

log = logging.getLogger(__name__)


# Spring Cloud Zookeeper's payload class, which every Spring Boot DiscoveryClient is typed to.
SPRING_PAYLOAD_CLASS = "org.springframework.cloud.zookeeper.discovery.ZookeeperInstance"


@dataclass(frozen=True)
class SpringPayload:
    """Spring Cloud Zookeeper's payload, ``ZookeeperInstance {id, name, metadata}``: what a
    Spring Boot service registers, and what every Spring ``DiscoveryClient`` reading the base
    path is typed to. ``metadata`` maps strings to strings (Spring's
    ``spring.cloud.zookeeper.discovery.metadata.*``; ``instance_status`` other than ``UP``
    takes the instance out of Spring's load balancer); ``id`` and ``name`` default to the
    instance id and the service::

        publisher.register("payments", "10.0.0.5", 8080, payload=SpringPayload({"zone": "eu-1"}))
    """

    metadata: Mapping[str, str] = field(default_factory=dict)
    id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        """Refuse what Spring's ``Map<String, String>`` could not hold (ValidationError)."""
        if not isinstance(self.metadata, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.metadata.items()
        ):
            raise ValidationError("SpringPayload metadata maps strings to strings")
        for what, value in (("id", self.id), ("name", self.name)):
            if value is not None and not isinstance(value, str):
                raise ValidationError(f"SpringPayload {what} must be a string")

    def document(self, service: str, instance_id: str) -> dict[str, Any]:
        """The payload as Jackson writes it for Curator, ``@class`` first."""
        return {
            "@class": SPRING_PAYLOAD_CLASS,
            "id": instance_id if self.id is None else self.id,
            "name": service if self.name is None else self.name,
            "metadata": dict(self.metadata),
        }


@dataclass(frozen=True)
class CuratorRegistration:
    """One instance registered by a :class:`CuratorPublisher`: its service, id and node."""

    service: str
    id: str
    path: str


class CuratorPublisher:
    """Registers instances in Curator's format under ``base_path`` (see the module)."""

    def __init__(
        self,
        hosts: str | None = None,
        base_path: str = "/services",
        *,
        session_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        tls: TlsConfig | None = None,
        identity: str | None = None,
    ) -> None:
        self.base_path = validate_base_path(base_path, "base_path")
        self.hosts = resolve_hosts(hosts)
        self._connect_timeout = connect_timeout
        self._zk = KazooClient(
            hosts=self.hosts, timeout=session_timeout, **client_arguments(identity, tls)
        )
        self._nodes = EphemeralNodes(self._zk)
        self._started = False
        # Without one, kazoo writes world:anyone nodes: anyone may rewrite or delete them.
        identity = effective_identity(identity)  # as its session (client_arguments) has it
        self._identified = identity is not None
        # A base path it creates stays open to the JVM's services beside its own (anyone may
        # add a service, nobody else change or delete what is there); a service node it
        # creates is its identity's alone (kazoo's default ACL: all rights, world READ).
        self._base_acl = None if identity is None else [owner_acl(identity), WORLD_READ_CREATE]

    def __repr__(self) -> str:
        return f"<CuratorPublisher hosts={self.hosts!r} base_path={self.base_path!r}>"

    def __enter__(self) -> CuratorPublisher:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> CuratorPublisher:
        """Open the session (:class:`~sentinel.errors.ZooKeeperUnavailable` if no server
        answers within ``connect_timeout``)."""
        start_client(self._zk, self.hosts, self._connect_timeout)
        self._nodes.start()
        self._started = True
        if not self._identified:
            log.warning(
                "CuratorPublisher without an identity: its instance nodes under %s are "
                "world:anyone, so anyone may rewrite (redirect) or delete them; give "
                "identity='user:password' or $%s (docs/interop.md)",
                self.base_path,
                IDENTITY_ENV,
            )
        return self

    def close(self) -> None:
        """End the session: ZooKeeper removes every instance this publisher registered."""
        if not self._started:
            return
        self._started = False
        try:
            self._nodes.close(timeout=2.0)
        finally:
            self._zk.stop()
            self._zk.close()
            self._nodes.join(10.0)

    @translate_zk_errors
    def register(
        self,
        service: str,
        address: str,
        port: int | None = None,
        *,
        ssl_port: int | None = None,
        instance_id: str | None = None,
        payload: Any = None,
        uri_spec: str | None = None,
        enabled: bool = True,
    ) -> CuratorRegistration:
        """Register one instance of ``service`` (``port``, ``ssl_port`` or both); its id is
        ``instance_id`` or a new UUID, as Curator's builder makes one. ``payload`` is a
        :class:`SpringPayload` (Spring Cloud Zookeeper's), or any JSON (a mapping is written
        with Jackson's ``@class`` of a ``LinkedHashMap`` unless it names one). ``uri_spec`` is
        Curator's template (``"{scheme}://{address}:{port}"``).

        The payload's class must be the one the base path's instances carry, which its JVM
        readers are typed to: :class:`~sentinel.errors.PayloadClassMismatch` otherwise, naming
        that class (nothing is written). No payload into a base path of Spring instances is
        an empty :class:`SpringPayload`."""
        if not self._started:
            raise ClientClosed("the publisher is not started: call start() or use 'with'")
        # The node's name parts must be valid names; the instance checks the rest, as a
        # decoder checks what it reads.
        validate_name("service", service)
        instance_id = validate_name("instance id", instance_id or str(uuid.uuid4()))
        payload = self._payload_for(service, instance_id, payload)
        instance = CuratorInstance(
            name=service,
            id=instance_id,
            address=address,
            port=port,
            ssl_port=ssl_port,
            payload=payload,
            registration_time_utc=int(time.time() * 1000),
            uri_spec=None if uri_spec is None else parse_uri_spec(uri_spec),
            enabled=enabled,
        )
        parent = f"{self.base_path}/{service}"
        path = f"{parent}/{instance_id}"
        self._nodes.put(
            path, encode_instance(instance), prepare=functools.partial(self._make_parent, parent)
        )
        return CuratorRegistration(service, instance_id, path)

    def _make_parent(self, parent: str) -> None:
        self._zk.ensure_path(self.base_path, acl=self._base_acl)
        self._zk.ensure_path(parent)

    def _payload_for(self, service: str, instance_id: str, payload: Any) -> Any:
        """``payload`` as written: of the class the base path's instances carry, or refused."""
        expected = payload_classes(self._zk, self.base_path, service)
        if payload is None and SPRING_PAYLOAD_CLASS in expected:
            payload = SpringPayload()  # Spring's readers expect one on every instance
        if isinstance(payload, SpringPayload):
            payload = payload.document(service, instance_id)
        if payload is None or not expected:
            return payload
        # Jackson reads a typed payload from an object naming its class; anything else fails.
        given = payload_class(payload) or f"JSON {type(payload).__name__}"
        if given in expected:
            return payload
        wanted = sorted(expected)
        how = (
            "payload=SpringPayload(metadata={...}) (from sentinel.curator)"
            if SPRING_PAYLOAD_CLASS in expected
            else f"a payload mapping with '@class': {wanted[0]!r} and that class's fields"
        )
        raise PayloadClassMismatch(
            f"the instances under {self.base_path} carry payloads of class "
            f"{' and '.join(wanted)}, which their JVM readers are typed to; a {given} payload "
            f"would fail their whole query (Curator's queryForInstances throws "
            f"ClassCastException). Register with {how}",
            expected=wanted[0],
            given=given,
        )

    @translate_zk_errors
    def deregister(self, registration: CuratorRegistration) -> bool:
        """Delete the instance if this publisher still holds it; False if it did not."""
        return self._nodes.remove(registration.path)
