"""A client's settings, resolved once into value objects: what ``Sentinel(...)`` was given, its
environment and its region's entry, each checked where it is given.

:class:`ClientSettings` is what :class:`~sentinel.Sentinel` is made from: the session's
settings (:class:`~sentinel.session.SessionSettings`: where the ensemble is, who this process
is) and the rest its builder (:mod:`sentinel.builder`) needs. Nothing here connects or reads a
file but the TLS configuration's: the key ring and the session are built from these values.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from sentinel import validation as check
from sentinel.agentlink.protocol import ENV as AGENT_ENV
from sentinel.agentlink.protocol import socket_path as agent_socket
from sentinel.auth.config import AuthConfig
from sentinel.auth.keys import SIGNER_ENV
from sentinel.cache.config import CacheConfig
from sentinel.devserver import resolve_hosts
from sentinel.errors import ValidationError
from sentinel.feedback import InstanceFeedback, OutlierDetection
from sentinel.regions.config import Region, Regions
from sentinel.regions.identity import identity_for
from sentinel.registry.layout import (
    DEFAULT_NAMESPACE,
    sanitize_name,
    validate_name,
    validate_namespace,
)
from sentinel.session import SessionSettings
from sentinel.zk.tls import TlsConfig


def default_client_id() -> str:
    """``<hostname>-<pid>``, made a valid name: unique per process on a host."""
    return sanitize_name(f"{socket.gethostname()}-{os.getpid()}")


@dataclass(frozen=True)
class ClientSettings:
    """Every setting of one client, resolved and checked (:meth:`resolve`)."""

    session: SessionSettings
    #: This client's region and the others it may fail over to (None: one region).
    regions: Regions | None
    auth: AuthConfig
    #: The manager's public key credentials must be signed with (``AuthConfig.signer``, else
    #: ``$SENTINEL_AUTH_SIGNER``), or None.
    signer: str | None
    feedback: OutlierDetection | InstanceFeedback | None
    prometheus_registry: CollectorRegistry | None

    @classmethod
    def resolve(
        cls,
        hosts: str | None,
        client_id: str | None,
        namespace: str | None,
        *,
        connect_timeout: float,
        session_timeout: float,
        tls: TlsConfig | bool | None,
        identity: str | None,
        app: str | None,
        announce: bool,
        auth: AuthConfig | None,
        cache: CacheConfig | None,
        feedback: OutlierDetection | InstanceFeedback | None,
        prometheus_registry: CollectorRegistry | None,
        agent: str | bool | None,
        regions: Regions | bool | None,
        agent_region: str | None,
    ) -> ClientSettings:
        """``Sentinel(...)``'s arguments, resolved: a region's entry supplies ``hosts``,
        ``namespace``, ``tls`` and ``identity`` not given, before their environment defaults.
        Raises :class:`~sentinel.errors.ValidationError` naming the first wrong one."""
        # Every setting is checked here, once, so a wrong one fails where it is given: the
        # lookup path never checks them. Where the client connects first (its region's entry,
        # the agent, the names, the ensemble), then the numbers and the value objects.
        resolved_regions = Regions.resolve(regions)
        # The region this client reads: the agent's other region it names, else its own.
        reads = agent_region
        if reads is None and resolved_regions is not None:
            reads = resolved_regions.local
        entry = (
            None
            if resolved_regions is None or reads is None
            else resolved_regions.regions.get(reads)
        )
        if entry is not None:  # given arguments win over the region's entry, which wins over $...
            hosts = entry.hosts if hosts is None else hosts
            namespace = entry.namespace if namespace is None else namespace
            tls = entry.tls if tls is None else tls
        identity = identity_for(
            reads,
            entry.identity if identity is None and entry is not None else identity,
            None if resolved_regions is None else resolved_regions.home,
        )
        agent_path = _agent_socket(agent)
        if agent_region is not None:
            agent_region = validate_name("region", agent_region)
            if agent_path is None:
                raise ValidationError(
                    "agent_region reads another region through the host "
                    "agent: give agent= (or $SENTINEL_AGENT) too"
                )
        namespace = validate_namespace(DEFAULT_NAMESPACE if namespace is None else namespace)
        client_id = validate_name("client", default_client_id() if client_id is None else client_id)
        app = None if app is None else validate_name("app", app)
        hosts = resolve_hosts(hosts)
        tls = TlsConfig.resolve(tls)
        connect_timeout = check.number("connect_timeout", connect_timeout, above=0)
        session_timeout = check.number("session_timeout", session_timeout, above=0)
        auth = check.instance("auth", auth, AuthConfig) or AuthConfig()
        cache = check.instance("cache", cache, CacheConfig) or CacheConfig()
        if feedback is not None and not isinstance(feedback, OutlierDetection | InstanceFeedback):
            raise ValidationError(
                "feedback must be OutlierDetection, InstanceFeedback or None, "
                f"not {type(feedback).__name__}"
            )
        check.instance("prometheus_registry", prometheus_registry, CollectorRegistry)
        check.instance("identity", identity, str)  # given, or its region entry's (checked)
        check.flag("announce", announce)
        session = SessionSettings(
            hosts=hosts,
            namespace=namespace,
            client_id=client_id,
            connect_timeout=connect_timeout,
            session_timeout=session_timeout,
            tls=tls,
            identity=identity,
            agent=agent_path,
            agent_region=agent_region,
            auth_client=auth.client or client_id,  # AuthConfig checked its name
            require_signed=auth.require_signed,
            cache=cache,
            app=app,
            announce=announce,
        )
        return cls(
            session=session,
            regions=resolved_regions,
            auth=auth,
            signer=auth.signer or os.environ.get(SIGNER_ENV) or None,
            feedback=feedback,
            prometheus_registry=prometheus_registry,
        )

    def in_region(self, region: Region, feedback: InstanceFeedback) -> dict[str, Any]:
        """The arguments of the client this one opens to another ``region`` for its failover
        lookups: this client's identity and settings, that region's ensemble, sharing
        ``feedback``; no snapshot file (the file is the local client's) and no metrics.

        In agent mode, through the host agent, which holds one session per region for the
        host's processes (docs/decisions/agent-sessions-to-other-regions.md)."""
        assert self.regions is not None  # only a client with other regions opens one
        session = self.session
        return {
            "hosts": region.hosts,
            "client_id": session.client_id,
            "namespace": region.namespace,
            "connect_timeout": session.connect_timeout,
            "session_timeout": session.session_timeout,
            "tls": region.tls,
            "identity": self.regions.identity_of(region),
            "app": session.app,
            "announce": session.announce,
            "auth": self.auth,
            "cache": dataclasses.replace(session.cache, snapshot_path=None),
            "feedback": feedback,
            "prometheus_registry": None,
            "agent": False if session.agent is None else session.agent,
            "regions": False,
            "agent_region": None if session.agent is None else region.name,
        }


def _agent_socket(agent: str | bool | None) -> str | None:
    """The host agent's socket a client of ``agent=`` takes its registry from (None: a
    session of its own)."""
    if agent is not None and not isinstance(agent, str | bool):
        raise ValidationError(
            f"agent must be a socket path, True, False or None, not {type(agent).__name__}"
        )
    if isinstance(agent, str) and not isinstance(agent, bool):
        return agent_socket(agent)
    if agent is True or (agent is None and os.environ.get(AGENT_ENV)):
        return agent_socket()
    return None
