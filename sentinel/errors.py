"""The exception hierarchy: every error Sentinel raises derives from :class:`SentinelError`.

Catch ``SentinelError`` to handle anything the SDK raises; catch a group's base to handle one
kind of failure, or a leaf for one cause. Input errors also derive from :class:`ValueError`, so
code written against plain Python conventions keeps working. Errors pickle with their fields
(Spark carries them from executors to the driver)::

    SentinelError
    ├── ValidationError (ValueError)         input: refused before anything was written
    │   ├── InvalidName
    │   ├── InvalidConnectString             hosts= / --zk / $SENTINEL_ZK: .part names what
    │   ├── ValueTooLarge
    │   ├── InstanceNotRegistered            update_metrics for no live instance
    │   ├── TlsConfigError
    │   ├── RegionConfigError                regions=, $SENTINEL_REGIONS, --regions: .field
    │   ├── PayloadClassMismatch             a Curator payload its JVM readers cannot read
    │   └── SigningRequired (also AuthError)
    ├── DecodeError                          a znode that is not a record we understand
    │   ├── PersistentInstance               a planted instance a secured namespace skips
    │   └── ShardMapInvalid                  a bucket that contradicts its policy: .key .bucket
    ├── ResolutionError                      lookup: .service .key .partition .policy
    │   ├── ServiceNotFound
    │   ├── PartitionNotFound                permanent for that key (.shard_policy)
    │   ├── NoInstanceAvailable
    │   └── ReadThroughThrottled             temporary: retry after .retry_after seconds
    ├── EndpointFailed                       work kept failing on resolved endpoints
    ├── SnapshotRejected
    ├── ClientClosed
    ├── CalledFromListener                   a call that would wait for the listener's thread
    ├── ZooKeeperUnavailable                 connection
    │   ├── ConnectionInterrupted
    │   ├── TlsHandshakeFailed
    │   ├── ZooKeeperUnreachable             every server refused, or its name does not resolve
    │   └── AgentUnavailable                 the host agent's socket did not answer
    │       ├── AgentNotTrusted              its listener is not the agent this process trusts
    │       ├── AgentServiceUnavailable      the agent cannot send one service (.service)
    │       └── RegionNotServed              the agent has no such region in its configuration
    ├── AgentProtocolError                   a frame on the agent's socket refused
    ├── AddressInUse                         where the agent was to listen, another does
    ├── NamespaceNotFound
    ├── RegistryError                        ZooKeeper refused an operation
    │   ├── AccessDenied
    │   │   └── NamespaceNotControlled
    │   └── AuthenticationFailed
    ├── RegistryConflict                     writes
    │   └── LabelTaken
    ├── ServiceConflict
    ├── ServiceInUse                         retire: instances or followers remain (.service)
    ├── ShardPolicyNotFound
    ├── ShardPolicyExists
    │   └── ShardPolicyConflict              shard_maps.ensure: another spec is stored
    ├── RegionsFailed                        a write to every region: .failures .written
    ├── AuthError                            credentials (/auth)
    │   ├── KeyFileError
    │   ├── ClientKeyNotFound
    │   ├── ClientNotEnrolled
    │   ├── KeySlotNotOwned
    │   ├── NamespaceNotTrusted (also AccessDenied)
    │   ├── RotationFailed                   .step .laggards
    │   └── EnvelopeError                    not openable, or a replay: the message says which
    ├── SourceError                          the metric collector's sources
    │   └── SourceTimeout
    └── LauncherError                        the local ZooKeeper/PostgreSQL/Spark servers
        ├── ZooKeeperNotInstalled
        ├── ZooKeeperStartFailed
        ├── DevServerNotRunning
        ├── PostgresNotInstalled
        ├── PostgresStartFailed
        ├── SparkNotInstalled
        └── SparkStartFailed
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sentinel.suggestions import did_you_mean, likely_typos


def _restore(cls: type[SentinelError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class SentinelError(Exception):
    """Base class of every error raised by Sentinel."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles as ``cls(*args)``, which breaks every subclass whose constructor
        # takes fields rather than the message; restore the message and the fields instead.
        return _restore, (type(self), self.args, self.__dict__)


# --- input ------------------------------------------------------------------------------------


class ValidationError(SentinelError, ValueError):
    """An argument was rejected before anything was written to ZooKeeper."""


class InvalidName(ValidationError):
    """A service, partition, label, client or zone name is not a valid node name."""


class InvalidConnectString(ValidationError):
    """A ZooKeeper connect string that is not ``host:port,...``, refused before connecting;
    ``part`` is the piece that is wrong (a host, a port, a chroot), or None when there is
    none at all."""

    def __init__(self, message: str, *, part: str | None = None) -> None:
        super().__init__(message)
        self.part = part


class RegionConfigError(ValidationError):
    """A regions configuration (``Sentinel(regions=...)``, ``$SENTINEL_REGION(S)``,
    ``--region(s)``) that cannot be used; ``field`` names the part that is wrong, as a dotted
    path (``regions.west.hosts``, ``local``)."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class ValueTooLarge(ValidationError):
    """An encoded value is over the size Sentinel allows for one znode."""


class InstanceNotRegistered(ValidationError):
    """Metrics were published for an instance that is not registered (no live node of that
    service, partition and label): they would sit in an orphan node no lookup reads, so nothing
    was written."""


class DecodeError(SentinelError):
    """A znode's bytes are not a record this version of Sentinel understands.

    Readers skip such nodes and count them; the error carries the path and the reason.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot decode {path}: {reason}")
        self.path = path
        self.reason = reason


class PersistentInstance(DecodeError):
    """An instance node that is persistent where a secured namespace serves only ephemeral
    ones: a publisher's instance lives with its session, so a persistent one was planted (and
    may be pinned by a child nobody else may delete). Skipped and counted as any
    undecodable node; ``sentinel doctor`` names it."""


class ShardMapInvalid(DecodeError):
    """A directory bucket that decodes but contradicts its policy: a key stored in another
    bucket than its own (``crc32(key) % buckets``), a partition the policy does not declare,
    or a bucket number the policy does not have. Any writer of ``/shard_info`` can plant one,
    and fix the digest to add up. Readers skip the bucket (counted) and keep what they held;
    ``sentinel shard sync`` refuses to copy the map; ``sentinel doctor`` names it. ``policy``,
    ``bucket`` (its number), ``key`` and ``partition`` say what is wrong (``key`` and
    ``partition`` None when the bucket number alone is)."""

    def __init__(
        self,
        path: str,
        reason: str,
        *,
        policy: str,
        bucket: int,
        key: str | None = None,
        partition: str | None = None,
    ) -> None:
        super().__init__(path, reason)
        self.policy = policy
        self.bucket = bucket
        self.key = key
        self.partition = partition


class PayloadClassMismatch(ValidationError):
    """A Curator payload of another class than the one the base path's instances carry:
    the JVM readers there are typed to that class, and Jackson would hand them a value they
    cannot cast (Curator's ``queryForInstances`` then fails for every instance, not just
    this one). ``expected`` is the class found there, ``given`` the one refused."""

    def __init__(self, message: str, expected: str, given: str) -> None:
        super().__init__(message)
        self.expected = expected
        self.given = given


# --- resolution -------------------------------------------------------------------------------


class ResolutionError(SentinelError):
    """``get_service`` (or ``get_partition``) could not give an endpoint for this call.

    The fields say which call, so callers branch on them rather than on the message: ``service``,
    ``key``, ``partition`` (once the key mapped to one) and ``policy`` (the selection policy
    given), each ``None`` where it does not apply.
    """

    def __init__(
        self,
        message: str,
        *,
        service: str | None = None,
        key: object = None,
        partition: str | None = None,
        policy: object = None,
    ) -> None:
        super().__init__(message)
        self.service = service
        self.key = key
        self.partition = partition
        self.policy = policy


class ServiceNotFound(ResolutionError):
    """No spec node exists for the service in this namespace (or it cannot be read).

    ``suggestions`` holds the registered names closest to the one asked for (a typo's fix),
    most similar first; the message ends with them as "did you mean ...?".
    """

    NOT_REGISTERED = "is not registered"

    def __init__(
        self, service: str, reason: str = NOT_REGISTERED, suggestions: tuple[str, ...] = ()
    ) -> None:
        hint = f"; {did_you_mean(suggestions)}" if suggestions else ""
        super().__init__(f"service {service!r} {reason}{hint}", service=service)
        self.reason = reason
        self.suggestions = tuple(suggestions)


class PartitionNotFound(ResolutionError):
    """The key maps to no partition (no key, unknown key, or below the first range boundary).

    Permanent for that key until the shard map changes; ``shard_policy`` names the map.
    """

    def __init__(self, service: str, key: object, shard_policy: str, reason: str) -> None:
        super().__init__(
            f"service {service!r}: key {key!r} maps to no partition ({reason})",
            service=service,
            key=key,
        )
        self.shard_policy = shard_policy


class NoInstanceAvailable(ResolutionError):
    """The partition is known but no instance is eligible (none live, or the policy refused all)."""


class ReadThroughThrottled(ResolutionError):
    """A temporary failure: the key is not in the cached map and this service's budget of
    direct reads is spent.

    Unlike :class:`PartitionNotFound` it says nothing about the key: retry after
    ``retry_after`` seconds, or let the shard map's watch bring the key. Procedure 1's reads
    are rate-limited per service (``read_through_rate``).
    """

    def __init__(self, service: str, key: object, rate: float) -> None:
        super().__init__(
            f"service {service!r}: key {key!r} is not cached and the service's "
            f"{rate:g} direct reads/s are spent; retry shortly",
            service=service,
            key=key,
        )
        self.retry_after = 1.0 / rate if rate > 0 else 1.0


class EndpointFailed(SentinelError):
    """Work kept failing on freshly resolved endpoints; the last failure is the ``__cause__``."""


class SnapshotRejected(SentinelError):
    """A last-known-good snapshot file cannot be served: missing, corrupt, or of another
    namespace or ensemble; the message says which."""


class ClientClosed(SentinelError):
    """The client was used before :meth:`~sentinel.Sentinel.start` or after ``close()``."""


class CalledFromListener(SentinelError):
    """A call that waits for the client's cache (a credential rotation, which waits for this
    client's confirmation among others) was made from a change listener, which runs on the
    cache's worker: it would wait for itself. Refused at once; make it from another thread."""


# --- connection -------------------------------------------------------------------------------


class ZooKeeperUnavailable(SentinelError):
    """No ZooKeeper server answered within the timeout."""


class ConnectionInterrupted(ZooKeeperUnavailable):
    """The connection to ZooKeeper was lost during a call; it may or may not have taken effect.

    The client reconnects by itself; retry the call once it has.
    """


class TlsHandshakeFailed(ZooKeeperUnavailable):
    """ZooKeeper answered but no TLS session could be set up with it: its certificate is not
    trusted (wrong or missing CA), does not name the host, or it refused the client's
    certificate; the message carries the TLS library's reason."""


class ZooKeeperUnreachable(ZooKeeperUnavailable):
    """No server of the connect string can be reached at all, said at once rather than after
    the timeout: each refused the connection (nothing listens on its port) or its name does
    not resolve. ``reasons`` says which, by ``host:port``. A server that is slow, or that
    does not answer, is :class:`ZooKeeperUnavailable` after the timeout."""

    def __init__(self, message: str, reasons: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.reasons = dict(reasons or {})


class AgentUnavailable(ZooKeeperUnavailable):
    """The host agent (``sentinel agent``) did not answer on its socket: not running, the
    socket missing, or this process not allowed to connect; the message names the socket."""


class AgentNotTrusted(AgentUnavailable):
    """What listens on the agent's socket is not the agent this process trusts: the socket
    file or its listener belongs to a user other than root, this process's own and
    ``$SENTINEL_AGENT_USER``. Nothing was sent to it; the message names both users."""


class AgentServiceUnavailable(AgentUnavailable):
    """The host agent holds ``service`` but cannot send it to this process (its state is
    larger than the agent's frame bound, or holds a node the agent cannot encode). The link
    stays up for the process's other services; this one is served as it was, marked stale
    (``connection_state`` ``suspended``), until the agent can send it again."""

    def __init__(self, message: str, service: str | None = None) -> None:
        super().__init__(message)
        self.service = service


class RegionNotServed(AgentUnavailable):
    """The host agent does not serve the region a client asked it for by name (a client of
    another region in agent mode): the agent's configuration (``--regions``,
    ``$SENTINEL_REGIONS``) has no such region, or it has no regions at all. The agent's
    answer, not a guess: the process treats the region as down, and never connects to it
    itself (the agent's operator decides where the host connects)."""


class AgentProtocolError(SentinelError):
    """A frame on the agent's socket that its reader cannot accept: too long, not JSON, or
    not a known message; the connection that sent it is dropped."""


class AddressInUse(SentinelError):
    """Where the agent was to listen (its Unix socket, its xDS socket or loopback port),
    another process already listens: nothing was started, and nothing there replaced."""


class TlsConfigError(ValidationError):
    """A TLS setting is unusable: a CA, certificate or key file that cannot be read or loaded,
    or a certificate without its key; the message names the file, never its content."""


class NamespaceNotFound(SentinelError):
    """The namespace root does not exist on this ensemble, and reading never creates it.

    ``namespace`` and ``hosts`` say which namespace on which ensemble. ``existing``, when the
    caller could list them, are the Sentinel namespaces beside it: one it is likely a typo of
    is suggested instead (``suggestions``, "did you mean '/sentinel'?"), and then nothing that
    would create the typo; else the message gives the ``sentinel init`` command that creates
    it (publishers and role daemons create it too, on their first write), after the advice
    to check the name when no namespace could be listed.
    """

    def __init__(self, namespace: str, hosts: str, existing: Sequence[str] | None = None) -> None:
        parent, _, name = namespace.rpartition("/")  # siblings: only their last names differ
        beside = {e.rpartition("/")[2]: e for e in existing or () if e.rpartition("/")[0] == parent}
        self.suggestions = tuple(beside[typo] for typo in likely_typos(name, beside))
        where = (
            f"namespace {namespace} does not exist on ZooKeeper {hosts} (reading never creates it)"
        )
        create = f"`sentinel init --zk {hosts} --namespace {namespace}`"
        if self.suggestions:
            message = f"{where}; {did_you_mean(self.suggestions)}"
        elif existing is None:
            message = (
                f"{where}: check the name (`sentinel ls --zk {hosts} --namespace {namespace}` "
                f"names one it may be a typo of), or create it with {create}"
            )
        else:
            message = f"{where}: create it with {create}"
        super().__init__(message)
        self.namespace = namespace
        self.hosts = hosts


class RegistryError(SentinelError):
    """ZooKeeper refused an operation for a reason other than a lost connection."""


class AccessDenied(RegistryError):
    """ZooKeeper's ACLs refused the operation: this client's identity may not change that
    section (or, through the host agent, read that service)."""


class NamespaceNotControlled(AccessDenied):
    """``sentinel init --secure`` refused a namespace root (or a parent of it) that someone
    else controls: an identity securing does not hold may change its ACL. Nothing was
    changed; the message names the node and the fix."""


class AuthenticationFailed(RegistryError):
    """ZooKeeper refused the client's identity when it connected (a SASL login with an unknown
    user or a wrong password); the message never carries the password."""


# --- writes -----------------------------------------------------------------------------------


class RegistryConflict(SentinelError):
    """Another writer kept changing the same node while Sentinel tried to write it."""


class LabelTaken(RegistryConflict):
    """The instance label is held, in that partition, by another live registration with another
    host and port: registering would silently replace it, so nothing was written."""


class ServiceConflict(SentinelError):
    """A service spec already exists with different settings than the ones asked for."""


class ServiceInUse(SentinelError):
    """A service that is not retired because instances are registered or clients follow it
    (``instances`` and ``followers`` count them); nothing was removed. ``sentinel service
    retire --force`` removes it all the same."""

    def __init__(self, service: str, instances: int, followers: int) -> None:
        super().__init__(
            f"service {service!r} is in use: {instances} instance(s) registered and "
            f"{followers} client(s) following it; nothing was removed (stop them first, or "
            "--force: a publisher still running registers it again)"
        )
        self.service = service
        self.instances = instances
        self.followers = followers


class ShardPolicyNotFound(SentinelError):
    """No shard policy of that name exists under ``/shard_info``."""


class ShardPolicyExists(SentinelError):
    """A shard policy of that name already exists."""


class ShardPolicyConflict(ShardPolicyExists):
    """``shard_maps.ensure``: the policy exists with another spec (kind, partitions...)."""


class RegionsFailed(SentinelError):
    """A change written region by region (the shard manager's) failed in some regions.

    ``failures`` maps each region that was not written to its error; ``written`` names the
    ones that were (each region's change is its own transactions: a region is written whole
    or not at all). Writes are idempotent: run the same change again to converge.
    """

    def __init__(self, failures: dict[str, SentinelError], written: tuple[str, ...]) -> None:
        named = "; ".join(f"{region}: {error}" for region, error in failures.items())
        done = f"written in {', '.join(written)}" if written else "written in no region"
        super().__init__(
            f"not written in {len(failures)} region(s) ({named}); {done}; run the same "
            "command again to converge"
        )
        self.failures = failures
        self.written = written


# --- credentials ------------------------------------------------------------------------------


class AuthError(SentinelError):
    """Base class of the errors of credential distribution (``/auth``)."""


class KeyFileError(AuthError):
    """A client key file or variable is missing, unreadable or not a Sentinel key ring."""


class ClientKeyNotFound(AuthError):
    """The client has published no public key, so no credential can be encrypted to it."""


class ClientNotEnrolled(AuthError):
    """A secured namespace has no key slot for this client, or not one this identity may
    write: the admin enrols it (``sentinel auth enroll``)."""


class KeySlotNotOwned(AuthError):
    """A client's key slot is not owned by the identity the admin enrolled for it (anyone,
    or someone else, may have written the keys in it): nothing is encrypted to it."""


class NamespaceNotTrusted(AuthError, AccessDenied):
    """The namespace looks secured, but does not let this identity write ``/auth``: it is not
    the auth manager's, or whoever secured the namespace did not know it (someone else may
    have made it). Nothing is encrypted to the key slots in it."""


class EnvelopeError(AuthError):
    """A credential envelope cannot be opened, or opens to a credential older than one the
    client applied (a replay). The message says which check failed: the key it was
    encrypted to is not held, it is not signed by the manager the client trusts, the
    ciphertext does not authenticate (tampered, another key, or moved to another node), or
    the version is older than one applied. Every cause is handled alike: the envelope is
    skipped, logged and counted.

    The message names the service, client, version and key id, never secret material.
    """


class SigningRequired(AuthError, ValidationError):
    """The namespace is secured (``sentinel init --secure``), so credentials must be signed,
    and no key was configured: a client needs the manager's public key
    (``AuthConfig(signer=...)``), a manager its signing key. Raised before anything is written;
    the message names the setting.
    """


class RotationFailed(AuthError):
    """A credential rotation stopped at one step; the old credential is still valid.

    ``step`` is ``create``, ``publish``, ``confirm`` or ``revoke``; ``laggards`` names the live
    clients that had not applied the new version when the rotation gave up waiting.
    """

    def __init__(self, step: str, message: str, laggards: tuple[str, ...] = ()) -> None:
        super().__init__(f"rotation failed at step {step!r}: {message}")
        self.step = step
        self.detail = message
        self.laggards = laggards


# --- the metric collector -----------------------------------------------------------------


class SourceError(SentinelError):
    """A metric source could not collect one instance (unreachable, bad output, timeout)."""


class SourceTimeout(SourceError):
    """A metric source did not answer within the collection's timeout."""


# --- the local servers (launcher) ------------------------------------------------------------


class LauncherError(SentinelError):
    """Base class for errors of the local server launchers (ZooKeeper, PostgreSQL, Spark)."""


class ZooKeeperNotInstalled(LauncherError):
    """No ZooKeeper installation was found; the message says what to install."""


class ZooKeeperStartFailed(LauncherError):
    """A ZooKeeper server process did not come up; the message holds the tail of its log."""


class DevServerNotRunning(LauncherError):
    """No local development server is running, and no connect string was given."""


class PostgresNotInstalled(LauncherError):
    """No PostgreSQL server binaries were found; the message says what to install."""


class PostgresStartFailed(LauncherError):
    """A PostgreSQL server command failed; the message holds its error and the log's tail."""


class SparkNotInstalled(LauncherError):
    """No Spark distribution or Java was found; the message says what to install."""


class SparkStartFailed(LauncherError):
    """A Spark master or worker did not come up; the message holds the tail of its log."""


__all__ = [
    "AccessDenied",
    "AddressInUse",
    "AgentNotTrusted",
    "AgentProtocolError",
    "AgentServiceUnavailable",
    "AgentUnavailable",
    "AuthError",
    "AuthenticationFailed",
    "CalledFromListener",
    "ClientClosed",
    "ClientKeyNotFound",
    "ClientNotEnrolled",
    "ConnectionInterrupted",
    "DecodeError",
    "DevServerNotRunning",
    "EndpointFailed",
    "EnvelopeError",
    "InstanceNotRegistered",
    "InvalidConnectString",
    "InvalidName",
    "KeyFileError",
    "KeySlotNotOwned",
    "LabelTaken",
    "LauncherError",
    "NamespaceNotControlled",
    "NamespaceNotFound",
    "NamespaceNotTrusted",
    "NoInstanceAvailable",
    "PartitionNotFound",
    "PayloadClassMismatch",
    "PersistentInstance",
    "PostgresNotInstalled",
    "PostgresStartFailed",
    "ReadThroughThrottled",
    "RegionConfigError",
    "RegionNotServed",
    "RegionsFailed",
    "RegistryConflict",
    "RegistryError",
    "ResolutionError",
    "RotationFailed",
    "SentinelError",
    "ServiceConflict",
    "ServiceInUse",
    "ServiceNotFound",
    "ShardMapInvalid",
    "ShardPolicyConflict",
    "ShardPolicyExists",
    "ShardPolicyNotFound",
    "SigningRequired",
    "SnapshotRejected",
    "SourceError",
    "SourceTimeout",
    "SparkNotInstalled",
    "SparkStartFailed",
    "TlsConfigError",
    "TlsHandshakeFailed",
    "ValidationError",
    "ValueTooLarge",
    "ZooKeeperNotInstalled",
    "ZooKeeperStartFailed",
    "ZooKeeperUnavailable",
    "ZooKeeperUnreachable",
]
