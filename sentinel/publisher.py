"""Registering service instances: ephemeral nodes under ``/services/<service>``.

Instances are kept by :class:`~sentinel.zk.ephemeral.EphemeralNodes`, so they come back by
themselves after a session expiry and take over stale nodes of older sessions. An instance
registered with a readiness check has its status follow it (:mod:`sentinel.health.readiness`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoAuthError, NodeExistsError, NoNodeError

from sentinel import shards
from sentinel import validation as check
from sentinel.auth.acl import ensure_clients_node
from sentinel.errors import (
    AccessDenied,
    LabelTaken,
    RegistryConflict,
    SentinelError,
    ServiceConflict,
    ServiceNotFound,
    ShardPolicyNotFound,
    ValidationError,
)
from sentinel.health.checks import HealthCheck
from sentinel.health.readiness import CHECKED_STATUSES, Readiness
from sentinel.registry.failover import LOCAL_ONLY, Failover
from sentinel.registry.layout import (
    departure_path,
    host_key,
    instance_name,
    instance_path,
    service_path,
    validate_name,
)
from sentinel.registry.records import InstanceRecord, ServiceSpec
from sentinel.zk.ephemeral import EphemeralNodes

log = logging.getLogger(__name__)

#: Attempts of :func:`write_failover`'s compare-and-set before it gives up (RegistryConflict).
FAILOVER_ATTEMPTS = 5


@dataclass(frozen=True)
class Registration:
    """A live registration made by this client: pass it to ``deregister`` or ``drain``."""

    instance: InstanceRecord
    path: str

    @property
    def service(self) -> str:
        """The registered service."""
        return self.instance.service

    @property
    def partition(self) -> str:
        """The partition the instance serves."""
        return self.instance.partition

    @property
    def label(self) -> str:
        """The instance's label, unique within its partition."""
        return self.instance.label


class Publisher:
    """Creates service specs and owns this client's registrations."""

    def __init__(self, zk: KazooClient, nodes: EphemeralNodes) -> None:
        self._zk = zk
        self._nodes = nodes
        self._registrations: dict[str, Registration] = {}
        # The registrations whose service's spec marks departures (ServiceSpec.
        # mark_departures), deleted with their departure_path; the others are deleted plainly.
        self._marked: set[str] = set()
        # Serialises the read-modify-write of a registration (an update, a check's status
        # write, a deregistration), so that none undoes another or re-creates a removed node.
        # Never taken on kazoo's thread nor by the ephemeral worker (which holds its own lock
        # while it calls _adopt_status).
        self._lock = threading.Lock()
        self._readiness = Readiness(self._published_status, self._set_checked_status)
        # Each service's spec and the partitions its shard policy declares (None: any), read
        # on the first registration and kept: what a registration uses of a spec never changes
        # in place (ensure_* refuse other settings; set_failover rewrites only ``failover``,
        # which no registration reads), so later registrations cost no extra read.
        # Kept while this client holds a registration of the service: forgotten with its
        # last, or it would grow with every service ever registered to, and a service retired
        # and created again with another scheme would be registered to as it was.
        self._targets: dict[str, tuple[ServiceSpec, shards.ShardPolicySpec | None]] = {}
        self._held: collections.Counter[str] = collections.Counter()  # registrations by service

    @property
    def registrations(self) -> tuple[Registration, ...]:
        """Registrations made by this client and not yet deregistered."""
        return tuple(self._registrations.values())

    def ensure_service(self, spec: ServiceSpec, *, strict: bool = True) -> ServiceSpec:
        """Create the service spec if missing; return the stored one.

        With ``strict``, raises :class:`ServiceConflict` if a spec exists with other settings.
        """
        path = service_path(spec.service)
        try:
            self._zk.create(path, spec.to_bytes(path))
        except NodeExistsError:
            pass
        except NoAuthError:
            # ZooKeeper checks the permission to create before whether the node exists: a
            # role that may not create services (a daemon announcing itself) still gets the
            # stored spec back when there is nothing to create.
            if self._zk.exists(path) is None:
                raise
        else:
            self._make_clients_node(spec.service)
            return spec
        data, _ = self._zk.get(path)
        stored = ServiceSpec.from_bytes(spec.service, path, data)
        if strict and stored != spec:
            raise ServiceConflict(_conflict(stored, spec))
        return stored

    def set_failover(self, service: str, rule: Failover | None) -> tuple[ServiceSpec, ServiceSpec]:
        """Rewrite the failover rule of an existing service (:func:`write_failover`)."""
        return write_failover(self._zk, service, rule)

    def _make_clients_node(self, service: str) -> None:
        """``/clients/<service>``, where its clients add themselves. In a secured namespace
        only publishers may create it (so nobody else chooses its ACL); an identity that may
        not is told, and ``sentinel init --secure`` creates what is missing."""
        try:
            ensure_clients_node(self._zk, service)
        except AccessDenied as exc:  # says which node, which right and who may repair it
            log.warning("%s; until then its clients cannot announce themselves", exc)

    def register(
        self,
        instance: InstanceRecord,
        *,
        inherit_scheme: bool = False,
        health: HealthCheck | None = None,
    ) -> Registration:
        """Publish ``instance``, creating its service spec if it is missing.

        The instance must agree with its service's spec: with ``inherit_scheme`` it takes the
        spec's scheme, otherwise a different scheme is a :class:`ValidationError`; a partition
        the service's shard policy does not declare is one too. Nothing is written then. The
        spec is read on the service's first registration by this client and kept, so only
        that one costs a round trip more.

        With ``health``, the instance is published ``starting`` (unless its status is
        ``draining`` or ``down``) and its status then follows the check
        (:class:`~sentinel.health.readiness.Readiness`); without, a check the same identity
        had is stopped.
        """
        check.instance("health", health, HealthCheck)  # before anything is written
        if health is not None:
            status = "starting" if instance.status == "up" else instance.status
            instance = dataclasses.replace(
                instance, status=status, health=health.source, check_name=health.name
            )
        with self._lock:
            registration = self._publish(instance, inherit_scheme)
            if health is None:
                self._readiness.forget(registration.path)
            else:
                self._readiness.follow(
                    registration.path,
                    registration.service,
                    registration.instance.host,
                    registration.instance.port,
                    health,
                )
        log.info("registered %s (%s:%d)", registration.path, instance.host, instance.port)
        return registration

    def update(self, registration: Registration, changes: Mapping[str, object]) -> Registration:
        """Publish ``changes`` to the registration as published now (a status another client
        set since is kept unless ``status`` is among them); its check, if any, goes on."""
        with self._lock:
            current = self.current(registration).instance
            return self._publish(dataclasses.replace(current, **changes), False)  # type: ignore[arg-type]

    def _publish(self, instance: InstanceRecord, inherit_scheme: bool) -> Registration:
        path = instance_path(instance.service, instance.partition, instance.label)
        data = instance.to_bytes(path)  # validates the size before anything (a spec) is written
        conformed, spec = self._conform(instance, inherit_scheme)
        take_over = self._same_endpoint(conformed, path)
        try:
            self._nodes.put(
                path, _value_of(conformed, instance, data, path), may_take_over=take_over
            )
        except NoNodeError:  # the service was removed since its spec was read: start over
            self._targets.pop(instance.service, None)
            conformed, spec = self._conform(instance, inherit_scheme)
            self._nodes.put(
                path, _value_of(conformed, instance, data, path), may_take_over=take_over
            )
        registration = Registration(conformed, path)
        if path not in self._registrations:
            self._held[instance.service] += 1
        self._registrations[path] = registration
        if spec.mark_departures:
            self._marked.add(path)
        else:
            self._marked.discard(path)
        self._nodes.follow(path, functools.partial(self._adopt_status, path))
        return registration

    def _published_status(self, path: str) -> str | None:
        mine = self._registrations.get(path)
        return None if mine is None else mine.instance.status

    def _set_checked_status(self, path: str, status: str, result: str | None) -> None:
        """A readiness check's status write, with its last ``result``: only over a status a
        check owns, and only while the registration lives (a deregistration holds the lock
        while it removes)."""
        with self._lock:
            # The kept bytes first: a drain the ephemeral worker adopts after this read makes
            # the put skip (the worker takes no lock of ours, so it can come between any two
            # lines here), and one adopted before it is in the registration read next
            # (_adopt_status stores the registration before the worker stores the bytes).
            kept = self._nodes.kept(path)
            mine = self._registrations.get(path)
            if kept is None or mine is None or mine.instance.status == status:
                return
            if mine.instance.status not in CHECKED_STATUSES:
                return  # draining: an operator's or the application's, never a check's
            instance = dataclasses.replace(mine.instance, status=status, check_result=result)
            take_over = self._same_endpoint(instance, path)
            if self._nodes.put(path, instance.to_bytes(path), may_take_over=take_over, expect=kept):
                self._registrations[path] = Registration(instance, path)

    def close(self) -> None:
        """Stop the readiness checks (the registrations end with the session)."""
        self._readiness.close()

    def current(self, registration: Registration) -> Registration:
        """``registration`` as this client publishes it now: with the status another client
        (``sentinel drain``) set since, if it did."""
        return self._registrations.get(registration.path, registration)

    def _adopt_status(self, path: str, kept: bytes, found: bytes) -> bytes | None:
        """The :meth:`EphemeralNodes.follow` rule of an instance node: a status another
        client wrote into it (an operator taking the instance out of rotation, or back) is
        kept, so that neither this client's later updates nor a re-creation after a session
        expiry undo it. Any other change is not this rule's to keep (None)."""
        mine = self._registrations.get(path)
        if mine is None:
            return None
        name = instance_name(mine.partition, mine.label)
        try:
            other = InstanceRecord.from_bytes(mine.service, name, path, found)
        except SentinelError:
            return None
        if dataclasses.replace(other, status=mine.instance.status) != mine.instance:
            return None
        self._registrations[path] = Registration(other, path)
        log.info(
            "%s: status %r set by another client (sentinel drain/undrain); kept",
            path,
            other.status,
        )
        return found

    def _conform(
        self, instance: InstanceRecord, inherit_scheme: bool
    ) -> tuple[InstanceRecord, ServiceSpec]:
        """``instance`` as its service's spec wants it, and the spec: ValidationError if it
        cannot be."""
        spec, policy = self._target(instance.service, instance.scheme)
        if spec.curator is not None:
            raise ValidationError(
                f"service {spec.service!r} takes its instances from the Curator registry at "
                f"{spec.curator.base_path}: an instance registered in the namespace would never "
                "be served; register it there (sentinel.curator.CuratorPublisher)"
            )
        if instance.scheme != spec.scheme:
            if not inherit_scheme:
                raise ValidationError(
                    f"service {spec.service!r} has scheme {spec.scheme!r}; an instance "
                    f"registered with scheme {instance.scheme!r} would be advertised at a URI "
                    f"its clients cannot use: pass scheme={spec.scheme!r} or leave it out"
                )
            instance = dataclasses.replace(instance, scheme=spec.scheme)
        if policy is not None:
            try:
                # The check shard_maps.assign makes: a partition no key can map to would
                # hold an instance no lookup ever returns.
                policy.check_partition(instance.partition)
            except ValidationError as exc:
                raise ValidationError(
                    f"cannot register {instance.label!r} of service {spec.service!r}: {exc}"
                ) from None
        return instance, spec

    def _target(
        self, service: str, scheme: str
    ) -> tuple[ServiceSpec, shards.ShardPolicySpec | None]:
        """The spec of ``service`` and its shard policy's spec, cached; a missing service is
        created with ``scheme`` (the first instance of a new service decides it)."""
        target = self._targets.get(service)
        if target is None:
            path = service_path(service)
            try:  # read first: the spec almost always exists, and a create would fail first
                data, _ = self._zk.get(path)
            except NoNodeError:
                spec = self.ensure_service(ServiceSpec(service, scheme=scheme), strict=False)
            else:
                spec = ServiceSpec.from_bytes(service, path, data)
            if spec.shard_policy is None:
                target = self._targets[service] = (spec, None)
                return target
            try:
                policy = shards.read_spec(self._zk, spec.shard_policy)
            except ShardPolicyNotFound:
                # A spec can name a policy not created yet (written by another program, or
                # its policy deleted since): no partition to check against until it exists,
                # so the instance is published and nothing is kept.
                log.warning(
                    "service %r is sharded by %r, which does not exist: its partitions are "
                    "not checked",
                    service,
                    spec.shard_policy,
                )
                return spec, None
            target = self._targets[service] = (spec, policy)
        return target

    @staticmethod
    def _same_endpoint(instance: InstanceRecord, path: str) -> Callable[[bytes], None]:
        """The check before another session's node at ``path`` is taken over.

        The same endpoint (host and port, compared in :func:`host_key` form) is this instance
        restarted, or re-registered after its session expired: its stale node is replaced.
        Another endpoint is another live instance that holds the label: :class:`LabelTaken`.
        A node that is not a valid instance protects nothing and is replaced.
        """
        mine = (host_key(instance.host), instance.port)
        name = instance_name(instance.partition, instance.label)

        def check(held: bytes) -> None:
            try:
                other = InstanceRecord.from_bytes(instance.service, name, path, held)
            except SentinelError:
                return
            if (host_key(other.host), other.port) != mine:
                raise LabelTaken(
                    f"label {instance.label!r} of partition {instance.partition!r} of service "
                    f"{instance.service!r} is held by another instance "
                    f"({other.host} port {other.port}); choose another label, or deregister "
                    "that instance first"
                )

        return check

    def deregister(self, registration: Registration) -> bool:
        """Remove a registration; False if this client did not hold it (already deregistered)."""
        with self._lock:
            if registration.path not in self._registrations:
                return False
            self._readiness.forget(registration.path)
            # Forgotten only once removed: a deregistration the connection interrupted is
            # retried. Marked when the service's spec asks, so that caches protecting it tell
            # it from a session's expiry (sentinel.cache.protection); else one plain delete.
            path = registration.path
            self._nodes.remove(path, mark=departure_path(path) if path in self._marked else None)
            self._forget(path)
        log.info("deregistered %s", registration.path)
        return True

    def leave(self, timeout: float) -> None:
        """Before the session ends (a closing client): deregister every registration of a
        service whose spec marks departures whose node is known to be this session's, marked
        and in one request, waiting ``timeout`` seconds at most. Caches then see a shutdown
        as a deregistration, never as a mass expiry to protect from; what this leaves (the
        other services' registrations among it), the session's end removes."""
        if not self._marked:
            return
        for path in self._nodes.leave({p: departure_path(p) for p in self._marked}, timeout):
            self._forget(path)

    def _forget(self, path: str) -> None:
        """A registration removed: forgotten, and its service's spec with the last one."""
        self._marked.discard(path)
        registration = self._registrations.pop(path, None)
        if registration is None:
            return
        service = registration.service
        self._held[service] -= 1
        if self._held[service] <= 0:
            del self._held[service]
            self._targets.pop(service, None)


def write_failover(
    zk: KazooClient, service: str, rule: Failover | None
) -> tuple[ServiceSpec, ServiceSpec]:
    """Set the ``failover`` field of ``service``'s spec to ``rule`` (None: remove it, the
    local region only), leaving every other field as stored; ``(before, after)`` specs.

    The write is conditional on the version read, so a concurrent change of the spec (another
    operator's rule, a curator source) is read again, never overwritten; after
    :data:`FAILOVER_ATTEMPTS` lost races, RegistryConflict. Raises ValidationError for a rule
    that is not a :class:`~sentinel.registry.failover.Failover` and ServiceNotFound for a
    service without a spec, before anything is written; DecodeError for a stored spec that is
    not one (nothing is written over it). A rule equal to the stored one writes nothing.
    """
    validate_name("service", service)
    if rule is not None and not isinstance(rule, Failover):
        raise ValidationError(f"failover must be a Failover or None, not {type(rule).__name__}")
    path = service_path(service)
    for _ in range(FAILOVER_ATTEMPTS):
        try:
            data, stat = zk.get(path)
        except NoNodeError:
            raise ServiceNotFound(service) from None
        before = ServiceSpec.from_bytes(service, path, data)
        after = dataclasses.replace(before, failover=rule)
        if after == before:
            return before, after
        try:
            zk.set(path, after.to_bytes(path), version=stat.version)
        except BadVersionError:
            continue  # changed since it was read: read it again
        except NoNodeError:
            raise ServiceNotFound(service) from None
        log.info(
            "service %r: failover %s -> %s",
            service,
            (before.failover or LOCAL_ONLY).describe(),
            (rule or LOCAL_ONLY).describe(),
        )
        return before, after
    raise RegistryConflict(
        f"{path} kept changing during {FAILOVER_ATTEMPTS} attempts to set its failover rule; "
        "nothing was written: run it again"
    )


def _conflict(stored: ServiceSpec, asked: ServiceSpec) -> str:
    """What ServiceConflict says: each field that differs, as stored and as asked for, and
    for the failover rule (changed in place, never by ensure_service) how to change it."""
    differing = [
        f.name
        for f in dataclasses.fields(ServiceSpec)
        if getattr(stored, f.name) != getattr(asked, f.name)
    ]

    def shown(spec: ServiceSpec) -> str:
        return ", ".join(f"{name}={_field_text(name, getattr(spec, name))}" for name in differing)

    text = f"service {stored.service!r} exists with {shown(stored)}; asked for {shown(asked)}"
    if "failover" in differing:
        text += (
            f" (a rule is changed in place: Sentinel.set_failover({stored.service!r}, ...) or "
            f"`sentinel failover {stored.service} RULE`)"
        )
    return text


def _field_text(name: str, value: object) -> str:
    if name == "failover":
        return (value or LOCAL_ONLY).describe()  # type: ignore[attr-defined]
    return repr(dict(value) if isinstance(value, Mapping) else value)


def _value_of(conformed: InstanceRecord, given: InstanceRecord, data: bytes, path: str) -> bytes:
    """The node's value: ``data``, the given instance's, when its spec took it as it was (one
    encoding on the write path, which runs before the create is sent)."""
    return data if conformed is given else conformed.to_bytes(path)
