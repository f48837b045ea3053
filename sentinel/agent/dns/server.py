"""The agent's DNS server: UDP and TCP on one address, answering from the agent's cache.

A name is answered from the service's snapshot in the agent's cache. A service first asked
for is loaded as xDS loads one (:class:`~sentinel.agent.loads.Loads`: on a worker, first
asked first, only when everyone may read it), and the query waits for it, at most
``load_wait`` seconds: a service the agent has not loaded yet (just restarted, ZooKeeper slow)
is never answered negatively, its query is left unanswered (its client asks again) rather
than told NXDOMAIN or SERVFAIL, which HAProxy would hold against its servers. Only a service
that does not exist (or that not everyone may read) is NXDOMAIN, and that answer is
remembered for the TTL (a name made up is read from ZooKeeper once a TTL).

Failover is decided as the xDS server decides it (:class:`~sentinel.agent.xds_failover.
Elsewhere`): on a change, on a worker, never per query.

What a peer may do: each source (a loopback client's socket, another host's address) has a
rate (a token bucket; over it, a query is dropped before it is parsed); what does not parse
as one DNS query, or is larger than :data:`MAX_QUERY_BYTES`, is dropped and counted, never
a traceback; queries waiting for a load, services followed and TCP connections are bounded;
logs are throttled and quote what a peer sent (:mod:`sentinel.agent.peers`). Threads: the
server's asyncio loop runs on a thread of its own, the cache's changes come from its worker
(handed to the loop, never waiting), loads and failover decisions on the workers of
:class:`~sentinel.agent.loads.Loads`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import functools
import ipaddress
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype

from sentinel import telemetry
from sentinel.agent.dns import answers
from sentinel.agent.dns.answers import Served
from sentinel.agent.dns.names import DEFAULT_ZONE, Question, parse, zone_name
from sentinel.agent.dns.rates import Rates
from sentinel.agent.dns.transports import Tcp, Udp
from sentinel.agent.loads import Loads
from sentinel.agent.peers import Throttled, quoted
from sentinel.agent.xds_failover import Elsewhere
from sentinel.errors import (
    AddressInUse,
    PartitionNotFound,
    SentinelError,
    ServiceNotFound,
    ValidationError,
)
from sentinel.events import ChangeEvent, InstancesChanged, ServiceSpecChanged

if TYPE_CHECKING:
    from sentinel.cache.views import ServiceSnapshot
    from sentinel.client import Sentinel

log = logging.getLogger(__name__)

#: The default TTL of every answer, positive and negative (docs/dns.md, "TTL").
DEFAULT_TTL = 5
#: The default number of instances an answer holds at most.
DEFAULT_ANSWER_LIMIT = 64
#: The largest query taken: a question (a name of 255 octets) and an OPT record with room
#: for options (cookies, padding); a larger one is no query of a resolver's.
MAX_QUERY_BYTES = 1024
#: The largest UDP answer: RFC 6891's 4096 on loopback (no fragmentation there), the 2020
#: DNS flag day's 1232 on any other address; never more than the client offers (512 without
#: EDNS0). Larger answers are truncated (TC) and whole over TCP.
LOOPBACK_UDP_PAYLOAD, UDP_PAYLOAD = 4096, 1232
#: Queries waiting for a service's load at once; more are dropped (counted as busy).
MAX_WAITING = 1024
#: Answers kept built per service (each a name, type and rotation).
MAX_BUILT = 256
#: Answers kept encoded (SRV and TXT: see DnsServer._encoded).
MAX_ENCODED = 256  # an answer holds at most the answer limit: a few kB each
_ENCODED_ONCE = frozenset({dns.rdatatype.SRV, dns.rdatatype.TXT})
_SERVICE_TYPES = frozenset(
    {dns.rdatatype.A, dns.rdatatype.AAAA, dns.rdatatype.SRV, dns.rdatatype.TXT}
)
_KIND = {
    dns.rdatatype.A: "a",
    dns.rdatatype.AAAA: "aaaa",
    dns.rdatatype.SRV: "srv",
    dns.rdatatype.TXT: "txt",
    dns.rdatatype.SOA: "soa",
}
_LOG_QUOTED_BYTES = 64


def parse_address(address: str, wildcard: bool = False) -> tuple[str, int]:
    """``--dns ADDRESS`` as a host and a port: ``PORT`` (loopback, ``127.0.0.1``),
    ``HOST:PORT`` or ``[V6]:PORT`` with an IP address; a wildcard address (``0.0.0.0``,
    ``[::]``: every interface) only with ``wildcard``. :class:`ValidationError` otherwise."""
    host, colon, port = address.rpartition(":")
    if not colon:
        host, port = "127.0.0.1", address
    host = host.removeprefix("[").removesuffix("]")
    try:
        ip = ipaddress.ip_address("127.0.0.1" if host == "localhost" else host)
    except ValueError:
        ip = None
    if ip is None or not port.isdigit() or int(port) > 65535:
        raise ValidationError(
            f"--dns {address!r} must be PORT (on 127.0.0.1) or IP:PORT ([IPV6]:PORT)"
        )
    if ip.is_unspecified and not wildcard:
        raise ValidationError(
            f"--dns {address!r} listens on every interface: say so with --dns-wildcard, or "
            "name one address (the agent serves its host, loopback, by default)"
        )
    return str(ip), int(port)


def check_free(address: str, wildcard: bool = False) -> None:
    """Refuse ``--dns ADDRESS`` before anything starts when it cannot be listened on:
    :class:`AddressInUse` when another process listens there (UDP or TCP)."""
    host, port = parse_address(address, wildcard)
    if port:
        for sock in bind(host, port):
            sock.close()


def bind(host: str, port: int) -> tuple[socket.socket, socket.socket]:
    """A UDP and a TCP socket bound to ``host``'s ``port`` (0: one free for both), the TCP
    one listening; :class:`AddressInUse` when another process holds either."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    for _ in range(1 if port else 16):
        udp = socket.socket(family, socket.SOCK_DGRAM)
        tcp = socket.socket(family, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no owner
        try:
            udp.bind((host, port))
            tcp.bind((host, udp.getsockname()[1]))
            tcp.listen(128)
        except OSError as exc:
            udp.close()
            tcp.close()
            if exc.errno != errno.EADDRINUSE:
                raise SentinelError(f"DNS: cannot listen on {shown}: {exc.strerror}") from None
            if port:
                raise AddressInUse(
                    f"DNS: {shown} is taken by another process (UDP or TCP): stop it, or give "
                    "--dns another address"
                ) from None
            continue  # a free UDP port whose TCP twin is taken: another one
        udp.setblocking(False)
        tcp.setblocking(False)
        return udp, tcp
    raise AddressInUse(f"DNS: no port free for both UDP and TCP on {host}")


@dataclass(eq=False)
class _Service:
    """One service followed (the loop's)."""

    ready: asyncio.Event = field(default_factory=asyncio.Event)  # loaded, or known absent
    snapshot: ServiceSnapshot | None = None  # as served: partitions held back applied
    absent_until: float = 0.0  # known not to exist (or not served) until then (monotonic)
    # The partitions another region serves: partition -> (region, instances).
    elsewhere: dict[str | None, tuple[str, tuple[Any, ...]]] = field(default_factory=dict)
    resolving: bool = False
    stale: bool = False
    turn: int = 0  # the rotation of its answers
    # The records of each answer given since the service last changed, by name, type and
    # rotation: dnspython builds a record set of 64 SRV records in milliseconds, so each
    # is built once per change, not per query (emptied at each change, and past MAX_BUILT).
    built: dict[tuple[object, ...], tuple[tuple[Any, ...], answers.Records]] = field(
        default_factory=dict
    )


class _Silent(Exception):
    """A query left unanswered on purpose (its reason, counted as dropped)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DnsServer:
    """Answers DNS for the services of ``sentinel``'s cache on ``address`` (``--dns``'s forms,
    :func:`parse_address`), UDP and TCP on one port.

    ``zone``: the names answered (else REFUSED: the agent is no recursive resolver);
    ``ttl``: of every answer; ``answer_limit``: instances per answer; ``load_wait``: seconds
    a query waits for its service's first load before it is left unanswered; ``rate`` and
    ``burst``: queries per second a source may send, and at once; ``max_services``: services
    followed at once (the least recently asked forgotten past it); ``max_connections`` and
    ``max_connections_per_source``: TCP connections at once; ``idle_timeout``: seconds a TCP
    connection may stay silent.
    """

    def __init__(
        self,
        sentinel: Sentinel,
        address: str,
        *,
        zone: str = DEFAULT_ZONE,
        ttl: int = DEFAULT_TTL,
        answer_limit: int = DEFAULT_ANSWER_LIMIT,
        wildcard: bool = False,
        load_wait: float = 2.0,
        rate: float = 1000.0,
        burst: float = 2000.0,
        max_services: int = 1024,
        max_connections: int = 256,
        max_connections_per_source: int = 64,
        idle_timeout: float = 10.0,
    ) -> None:
        self.sentinel = sentinel
        self._host, self._port = parse_address(address, wildcard)
        self.zone = zone_name(zone)
        self._ttl = ttl
        self._limit = answer_limit
        self._load_wait = load_wait
        self._rates = Rates(rate, burst)
        self._max_services = max_services
        self._max_connections = max_connections
        self._max_per_source = max_connections_per_source
        self._idle_timeout = idle_timeout
        loopback = ipaddress.ip_address(self._host).is_loopback
        self._udp_payload = LOOPBACK_UDP_PAYLOAD if loopback else UDP_PAYLOAD
        self._soa = answers.soa(self.zone, ttl)
        self._services: collections.OrderedDict[str, _Service] = collections.OrderedDict()
        self._waiting = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._sockets: tuple[socket.socket, socket.socket] | None = None
        self._remove_listener: Any = None
        self._loads = Loads(sentinel, "DNS", self._loaded, log)
        self._elsewhere = Elsewhere(sentinel, self._changed_elsewhere, self._wake)
        self._closing = False
        self._failed_once = False
        # SRV and TXT answers as sent, by the query's bytes after its id (the same question,
        # flags and EDNS0 record: the same answer), while nothing the server answers from
        # changed (_generation): what a poller asking the same name again costs is a lookup.
        # A and AAAA rotate at each query, and are encoded each time.
        self._encoded: dict[tuple[bytes, bool], tuple[int, bytes, list[str]]] = {}
        self._generation = 0
        # What peers send is logged at most once in a while, quoted.
        self._drops: collections.defaultdict[str, Throttled] = collections.defaultdict(
            lambda: Throttled(log)
        )

    @property
    def address(self) -> str:
        """Where it listens: ``HOST:PORT`` (``[V6]:PORT``), the port bound."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{host}:{self._port}"

    @property
    def services(self) -> int:
        """The services followed now."""
        return len(self._services)

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> DnsServer:
        """Listen (UDP and TCP; :class:`AddressInUse` when another process does there) and
        follow the cache's changes."""
        self._sockets = self._bind()
        self._thread = threading.Thread(target=self._run, name="sentinel-dns", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise SentinelError(f"DNS: cannot serve {self.address}: {self._failure}")
        self._remove_listener = self.sentinel.listen(None, self._on_change)
        log.info("agent serving DNS on %s (zone %s)", self.address, self.zone)
        return self

    def stop(self) -> None:
        """Stop listening; queries under way go unanswered (their clients ask again)."""
        self._closing = True
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        self._loads.close()
        self._elsewhere.close()
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # its loop has ended already
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> DnsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _bind(self) -> tuple[socket.socket, socket.socket]:
        """The UDP and TCP sockets, bound to one port (port 0: a free one for both)."""
        udp, tcp = bind(self._host, self._port)
        self._port = udp.getsockname()[1]
        return udp, tcp

    def _run(self) -> None:
        with asyncio.Runner() as runner:
            self._loop = runner.get_loop()
            try:
                runner.run(self._serve())
            except BaseException as exc:  # reported by start(), or logged once it has returned
                if self._ready.is_set():
                    log.exception("DNS: the server's loop failed")
                self._failure = exc
            finally:
                self._ready.set()
                for sock in self._sockets or ():
                    sock.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        assert self._sockets is not None
        udp, tcp = self._sockets
        transport, _ = await loop.create_datagram_endpoint(lambda: Udp(self.handle), sock=udp)
        connections = Tcp(
            self.handle,
            self._drop,
            self._max_connections,
            self._max_per_source,
            self._idle_timeout,
        )
        server = await asyncio.start_server(connections.serve, sock=tcp)
        retry = asyncio.ensure_future(self._loads.retry_forever())
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            retry.cancel()
            transport.close()
            server.close()

    # --- services: followed when first asked, kept while asked ------------------------------

    def _on_change(self, event: ChangeEvent) -> None:
        """The cache's worker: hand the changed service to the loop. Never waits."""
        if isinstance(event, InstancesChanged | ServiceSpecChanged):
            self._changed_elsewhere(event.service)

    def _changed_elsewhere(self, service: str) -> None:
        """Any thread: ``service`` changed (here, or in a region it fails over to)."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended: the server stopped
                self._loop.call_soon_threadsafe(self._refresh, service)

    def _wake(self, service: str, delay: float) -> None:
        """On the loop: look at ``service`` again in ``delay`` seconds (a hold-down ends)."""
        asyncio.get_running_loop().call_later(delay, self._refresh, service)

    def _refresh(self, service: str) -> None:
        state = self._services.get(service)
        if state is not None and state.snapshot is not None:
            self._publish(service, state, self.sentinel.session.cache.snapshots.get(service))

    def _loaded(self, service: str, snapshot: ServiceSnapshot | None) -> None:
        state = self._services.get(service)
        if state is not None:
            self._publish(service, state, snapshot)

    def _publish(self, service: str, state: _Service, snapshot: ServiceSnapshot | None) -> None:
        """Answer from ``snapshot`` now (None: the service does not exist, or is not served);
        a partition with nothing eligible here is decided on a worker (failover)."""
        state.ready.set()
        state.built.clear()
        self._generation += 1
        if snapshot is None:
            state.snapshot = None
            state.absent_until = time.monotonic() + self._ttl
            return
        state.absent_until = 0.0
        snapshot = self._elsewhere.apply(service, snapshot)
        state.snapshot = snapshot
        if not self._elsewhere.failing_over(service, snapshot):
            state.elsewhere = {}  # (the change itself moved the generation on)
        elif state.resolving:
            state.stale = True
        elif not self._closing:
            state.resolving = True
            future = asyncio.get_running_loop().run_in_executor(
                self._loads.executor, self._elsewhere.served, service, snapshot
            )
            future.add_done_callback(functools.partial(self._resolved, service, state))

    def _resolved(self, service: str, state: _Service, done: asyncio.Future[Any]) -> None:
        state.resolving = False
        if self._services.get(service) is not state or done.cancelled():
            return
        if state.stale:
            state.stale = False
            self._refresh(service)
            return
        failure = done.exception()
        if failure is not None:  # the agent's own bug: answers stay as they were
            log.error("DNS: which region serves %s failed", service, exc_info=failure)
            return
        state.elsewhere = {p: (region, tuple(i)) for p, (region, i) in done.result().items()}
        self._generation += 1

    def _follow(self, service: str) -> _Service:
        """``service``'s state, followed from now on when it was not (its load started);
        the least recently asked service is forgotten past ``max_services``."""
        state = self._services.get(service)
        if state is not None:
            self._services.move_to_end(service)
            if state.absent_until and time.monotonic() >= state.absent_until:
                state.absent_until = 0.0  # asked again: created since?
                state.ready.clear()
                self._loads.want(service)
            return state
        if len(self._services) >= self._max_services:
            oldest = next(iter(self._services))
            if self._loads.loading(oldest):
                raise _Silent("busy")  # every service followed is still loading: a flood
            self._forget(oldest)
        state = self._services[service] = _Service()
        self._loads.want(service)
        return state

    def _forget(self, service: str) -> None:
        self._generation += 1
        del self._services[service]
        self._loads.forget(service)
        self._elsewhere.forget(service)

    # --- queries ----------------------------------------------------------------------------

    def _drop(self, reason: str, peer: str, data: bytes = b"") -> None:
        telemetry.AGENT_DNS_DROPPED.labels(reason).inc()
        if data:
            self._drops[reason].warning(
                "DNS: dropped a query from %s (%s): %s",
                peer,
                reason,
                quoted(data[:_LOG_QUOTED_BYTES].hex()),
            )
        else:
            self._drops[reason].warning("DNS: dropped a query from %s (%s)", peer, reason)

    def _failed(self, query: dns.message.Message, peer: str, exc: Exception) -> None:
        """The agent's own failure answering ``query``: counted, its traceback logged once,
        then a line at most every few seconds (a packet repeated cannot flood the log)."""
        telemetry.AGENT_DNS_DROPPED.labels("error").inc()
        if not self._failed_once:
            self._failed_once = True
            log.error("DNS: answering %s failed", quoted(str(query.question)), exc_info=exc)
        else:
            self._drops["error"].warning(
                "DNS: answering %s from %s failed: %s",
                quoted(str(query.question)),
                peer,
                quoted(repr(exc)),
            )

    def handle(
        self, data: bytes, source: object, peer: str, tcp: bool
    ) -> bytes | asyncio.Future[bytes | None] | None:
        """The answer to ``data`` as sent by ``source`` (what its rate is kept for; ``peer``
        names it in the log; ``tcp``: unbounded by UDP's size), or a future of it (its
        service loading), or None: dropped (counted and logged, throttled)."""
        started = time.perf_counter()
        if not self._rates.admit(source):  # before anything else: a flood costs least here
            self._drop("rate", peer)
            return None
        if len(data) > MAX_QUERY_BYTES:
            self._drop("oversized", peer)
            return None
        encoded = self._encoded.get((data[2:], tcp))
        if encoded is not None and encoded[0] == self._generation:
            _, wire, kinds = encoded
            for kind in kinds:
                telemetry.AGENT_DNS_ANSWERS.labels(kind).inc()
            telemetry.AGENT_DNS_LATENCY.observe(time.perf_counter() - started)
            return data[:2] + wire  # the same bytes asked again: the same answer, its id
        try:
            query = dns.message.from_wire(data, ignore_trailing=False)
        except Exception:  # anything a parser may raise on bytes it was not meant for
            self._drop("malformed", peer, data)
            return None
        if query.flags & dns.flags.QR:
            self._drop("malformed", peer, data)  # an answer: never answered (no reflection)
            return None
        try:
            response = self._respond(query)
        except _Silent as silent:
            self._drop(silent.reason, peer)
            return None
        except _Pending as pending:
            return asyncio.ensure_future(self._later(pending, peer, tcp, started))
        except Exception as exc:  # the agent's own bug: this query only
            self._failed(query, peer, exc)
            return None
        wire = self._wire(response, query, tcp, started)
        if response.answer and response.question[0].rdtype in _ENCODED_ONCE:
            if len(self._encoded) >= MAX_ENCODED:
                self._encoded.clear()
            kinds = [_KIND[response.question[0].rdtype]]
            if wire[2] & (dns.flags.TC >> 8):
                kinds.append("truncated")
            self._encoded[data[2:], tcp] = (self._generation, wire[2:], kinds)
        return wire

    async def _later(self, pending: _Pending, peer: str, tcp: bool, started: float) -> bytes | None:
        """The answer once what it waits for is done (within ``load_wait``), else None."""
        query = pending.query
        if self._waiting >= MAX_WAITING:
            self._drop("busy", peer)
            return None
        self._waiting += 1
        try:
            response = await asyncio.wait_for(self._when_ready(pending), self._load_wait)
        except TimeoutError:
            self._drop("unloaded", peer)
            return None
        except _Silent as silent:
            self._drop(silent.reason, peer)
            return None
        except Exception as exc:
            self._failed(query, peer, exc)
            return None
        finally:
            self._waiting -= 1
        return self._wire(response, query, tcp, started)

    def _wire(
        self, response: dns.message.Message, query: dns.message.Message, tcp: bool, started: float
    ) -> bytes:
        """``response`` as sent: whole over TCP, over UDP within 512 octets or what the
        client's EDNS0 record offers (up to the server's own bound), cut with TC past it."""
        if tcp:
            size = 65535
        elif query.edns >= 0:
            size = max(512, min(query.payload, self._udp_payload))
        else:
            size = 512
        wire = response.to_wire(max_size=size, prefer_truncation=True)
        if dns.flags.TC & int.from_bytes(wire[2:4], "big"):  # set by to_wire as it cut
            telemetry.AGENT_DNS_ANSWERS.labels("truncated").inc()
        telemetry.AGENT_DNS_LATENCY.observe(time.perf_counter() - started)
        return wire

    def _response(self, query: dns.message.Message, rcode: dns.rcode.Rcode) -> dns.message.Message:
        response = dns.message.make_response(query, our_payload=self._udp_payload)
        response.flags |= dns.flags.AA
        response.flags &= ~dns.flags.RA
        response.set_rcode(rcode)
        return response

    def _respond(self, query: dns.message.Message) -> dns.message.Message:
        """The answer to ``query``; raises :class:`_Pending` when it must wait (a load, a
        key's partition), :class:`_Silent` when it goes unanswered."""
        if query.opcode() != dns.opcode.QUERY:
            telemetry.AGENT_DNS_ANSWERS.labels("notimp").inc()
            return self._response(query, dns.rcode.NOTIMP)
        if len(query.question) != 1:
            telemetry.AGENT_DNS_ANSWERS.labels("formerr").inc()
            return self._response(query, dns.rcode.FORMERR)
        asked = query.question[0]
        name = asked.name
        if asked.rdclass != dns.rdataclass.IN or not name.is_subdomain(self.zone):
            telemetry.AGENT_DNS_ANSWERS.labels("refused").inc()
            return self._response(query, dns.rcode.REFUSED)
        response = self._response(query, dns.rcode.NOERROR)
        if name == self.zone:
            if asked.rdtype == dns.rdatatype.SOA:
                response.answer.append(self._soa)
                telemetry.AGENT_DNS_ANSWERS.labels("soa").inc()
            else:
                self._negative(response, dns.rcode.NOERROR)
            return response
        labels = [
            label.decode("ascii", "replace").lower() for label in name.relativize(self.zone).labels
        ]
        question = parse(labels)
        if question is None:
            self._negative(response, dns.rcode.NXDOMAIN)
            return response
        state = self._follow(question.service)
        if not state.ready.is_set() or question.key is not None:
            raise _Pending(query, response, question, state)
        return self._answer(response, question, state, question.partition)

    def _answer(
        self,
        response: dns.message.Message,
        question: Question,
        state: _Service,
        partition: str | None,
    ) -> dns.message.Message:
        """``response`` filled with the records of ``question``, its service loaded (and the
        partition of its key, if any, found)."""
        asked = response.question[0]
        served = self._served(state, question, partition)
        if served is None:
            self._negative(response, dns.rcode.NXDOMAIN)
            return response
        if asked.rdtype not in _SERVICE_TYPES:
            self._negative(response, dns.rcode.NOERROR)
            return response
        found = self._records(state, asked.name, asked.rdtype, served)
        if not found.answer:
            self._negative(response, dns.rcode.NOERROR)
            return response
        response.answer.extend(found.answer)
        response.additional.extend(found.additional)
        telemetry.AGENT_DNS_ANSWERS.labels(_KIND[asked.rdtype]).inc()
        return response

    def _records(
        self, state: _Service, name: dns.name.Name, rdtype: int, served: Served
    ) -> answers.Records:
        """The records of ``name`` of ``rdtype`` served by ``served``: built once per change
        of the service and rotation (A and AAAA rotate: a client takes the first address;
        an SRV client picks by weight, whatever the order)."""
        turn = 0
        if rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA) and len(served.instances) > 1:
            state.turn += 1
            turn = state.turn % len(served.instances)
        key = (name, rdtype, turn)
        built = state.built.get(key)
        # Valid while it was built from these very tuples (a change makes new ones).
        if (
            built is not None
            and built[0][0] is served.instances
            and built[0][1] is served.registered
        ):
            return built[1]
        found = answers.records(name, rdtype, served, self.zone, self._ttl, self._limit, turn)
        if len(state.built) >= MAX_BUILT:
            state.built.clear()
        state.built[key] = ((served.instances, served.registered), found)
        return found

    def _negative(self, response: dns.message.Message, rcode: dns.rcode.Rcode) -> None:
        """NXDOMAIN, or NOERROR with no record: the zone's SOA in the authority section."""
        response.set_rcode(rcode)
        response.authority.append(self._soa)
        telemetry.AGENT_DNS_ANSWERS.labels(
            "nxdomain" if rcode == dns.rcode.NXDOMAIN else "empty"
        ).inc()

    def _served(self, state: _Service, question: Question, partition: str | None) -> Served | None:
        """What serves ``question`` (its partition found), None when it names nothing that
        exists: what a lookup would choose among, or another region's under failover."""
        snapshot = state.snapshot
        if snapshot is None:
            return None  # no such service, or not everyone may read it
        sharded = snapshot.spec.shard_policy is not None
        if partition is None and sharded:
            # A sharded service's instances are its partitions': never all of them at once
            # (a key would reach another partition's instances): a name with one is asked.
            return Served((), registered=snapshot.partitions.get(None, ()))
        # The group of instances a lookup chooses among: the partition's, or (unsharded)
        # the whole service's, in which an instance's name still holds its partition.
        group = partition if sharded else None
        if group not in snapshot.partitions or (
            partition is not None and not sharded and question.label is None
        ):
            return None
        registered = snapshot.partitions.get(group, ())
        eligible = snapshot.up.get(group, ())
        if eligible and self.sentinel.feedback.outliers:
            admitted = self.sentinel.feedback.admit(eligible)  # the same tuple if none ejected
            eligible = admitted if isinstance(admitted, tuple) else tuple(admitted)
        served = Served(eligible, registered=registered)
        if not eligible and group in state.elsewhere:
            region, instances = state.elsewhere[group]
            served = Served(instances, region, 1, registered)
        if question.label is None:
            return served
        name = f"{partition}:{question.label}"
        if not any(i.name == name for i in registered + served.instances):
            return None
        return Served(
            tuple(i for i in served.instances if i.name == name),
            served.region,
            served.priority,
            tuple(i for i in registered if i.name == name),
        )

    async def _when_ready(self, pending: _Pending) -> dns.message.Message:
        """The answer of a query that waited: its service loaded, its key's partition found
        (on a worker: a key not in the cached map is read through, from ZooKeeper)."""
        question, state, response = pending.question, pending.state, pending.response
        await state.ready.wait()
        partition = question.partition
        if question.key is not None and state.snapshot is not None:
            loop = asyncio.get_running_loop()
            try:
                partition = await loop.run_in_executor(
                    self._loads.executor,
                    self.sentinel.partition_of,
                    question.service,
                    question.key,
                )
            except (PartitionNotFound, ServiceNotFound):
                self._negative(response, dns.rcode.NXDOMAIN)
                return response
            except SentinelError:
                raise _Silent("unloaded") from None  # ZooKeeper could not say: not negative
            if partition is None:  # not sharded: a key names no partition
                self._negative(response, dns.rcode.NXDOMAIN)
                return response
        return self._answer(response, question, state, partition)


class _Pending(Exception):
    """A query that waits: for its service's first load, or its key's partition."""

    def __init__(
        self,
        query: dns.message.Message,
        response: dns.message.Message,
        question: Question,
        state: _Service,
    ) -> None:
        super().__init__()
        self.query = query
        self.response = response
        self.question = question
        self.state = state
