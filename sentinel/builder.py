"""What a client is built of, from its settings: the one place a :class:`~sentinel.Sentinel`
is put together.

:meth:`ClientParts.build` takes the resolved :class:`~sentinel.settings.ClientSettings` and
makes, in order, the key ring and the credentials' reader, the session
(:class:`~sentinel.session.Session`), the feedback, the roles bound to the session (the
shard-map, credential and metrics writers), the router to the other regions and the metrics'
export. Nothing here checks a setting (the settings did) and nothing connects (``start`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sentinel import telemetry
from sentinel.auth.keys import ClientKeyring, signer_missing, verify_key
from sentinel.auth.reader import CredentialReader
from sentinel.auth.writer import CredentialWriter
from sentinel.errors import SigningRequired
from sentinel.feedback import InstanceFeedback
from sentinel.metrics_writer import MetricsWriter
from sentinel.regions.config import Region
from sentinel.regions.remotes import RemoteClient
from sentinel.regions.router import Router
from sentinel.session import Mirror, Session
from sentinel.settings import ClientSettings
from sentinel.shards.writer import ShardMapWriter


@dataclass(frozen=True)
class ClientParts:
    """A client's session, feedback and roles, built from its settings."""

    session: Session
    feedback: InstanceFeedback
    shard_maps: ShardMapWriter
    credentials: CredentialWriter
    metrics: MetricsWriter
    #: The other regions' sessions and failover lookups; None without other regions.
    router: Router | None
    #: Where the client adds itself once started, None when its metrics are off.
    exports: telemetry.ClientCollector | None

    @classmethod
    def build(
        cls,
        settings: ClientSettings,
        *,
        mirror: Mirror,
        connect: Callable[[Region], RemoteClient],
    ) -> ClientParts:
        """The parts of a client of ``settings``, not started. ``mirror`` is told what the
        facade keeps of the session for its lookups; ``connect(region)`` makes a client of
        another region (opened when a failover first needs it). Raises
        :class:`~sentinel.errors.SigningRequired` for a key ring that must accept only signed
        credentials with no signer's key to verify them."""
        auth = settings.auth
        given = settings.session
        regions = settings.regions
        # The parts from the highest floor down (docs/overview.md), so that what a client is
        # given goes down the floors once: the router first, asking the session made below
        # whether it runs on a listener's thread only once a lookup fails over.
        router = (
            None
            if regions is None or not regions.others
            else Router(
                regions,
                connect,
                given.connect_timeout,
                lambda: session.on_listener_thread(),
            )
        )
        if auth.keys is None:
            keyring = ClientKeyring.from_env()
        elif isinstance(auth.keys, ClientKeyring):
            keyring = auth.keys
        else:
            keyring = ClientKeyring.load(auth.keys)
        if keyring is not None and settings.signer is None and auth.require_signed:
            raise SigningRequired(signer_missing(given.client_id, "require_signed=True"))
        credentials = (
            None
            if keyring is None
            else CredentialReader(
                keyring,
                given.namespace,
                given.auth_client,
                None if settings.signer is None else verify_key(settings.signer),
            )
        )
        session = Session(given, keyring=keyring, credentials=credentials, mirror=mirror)
        shard_maps = ShardMapWriter(lambda: session.zk, session.require_writable)
        metrics = MetricsWriter(
            lambda: session.zk, lambda: session.watches, session.require_writable
        )
        credential_writer = CredentialWriter(
            given.namespace,
            lambda: session.zk,
            session.require_writable,
            session.on_listener_thread,
        )
        feedback = settings.feedback
        return cls(
            session=session,
            feedback=(
                feedback if isinstance(feedback, InstanceFeedback) else InstanceFeedback(feedback)
            ),
            shard_maps=shard_maps,
            credentials=credential_writer,
            metrics=metrics,
            router=router,
            exports=(
                None
                if settings.prometheus_registry is None
                else telemetry.register(settings.prometheus_registry)
            ),
        )
