"""The records a name is answered with, from the instances a lookup would choose among.

Pure functions (no I/O, no threads) of the instances the server decided a name is served
by (:class:`Served`): the eligible instances of the agent's region, or, when it has none and
the service's failover rule says so, another region's (:mod:`sentinel.agent.xds_failover`,
as xDS): never both, for HAProxy ignores SRV priority. Eligible is what a lookup says:
status ``up`` (never draining, down or starting), not held back while returning home, not
ejected by reported failures (the agent's own feedback: :meth:`Sentinel.report
<sentinel.Sentinel.report>`).

* **A / AAAA**: the instances' addresses of that family, each once (two instances on one
  address, on different ports, are one address: SRV tells them apart);
* **SRV** (RFC 2782): one record per instance: priority 0 at home, 1 when they are another
  region's, the port, the weight scaled so that the heaviest is
  65535 (HAProxy divides SRV weights by 256: 1, 2 and 5 must stay 1:2:5), and a target
  name of the instance's own (:func:`~sentinel.agent.dns.names.instance_name`) whose A/AAAA
  record the additional section carries;
* **TXT**: what an operator debugging wants: each instance of the name with its region,
  status and address, and why one not answered is not (:mod:`sentinel.eligibility`).

The answer is rotated by one at each query (the round robin of the service's default
balancer) and cut at the answer limit.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

import dns.name
import dns.rdataclass
import dns.rdatatype
import dns.rrset
from dns.rdtypes.ANY.SOA import SOA
from dns.rdtypes.ANY.TXT import TXT
from dns.rdtypes.IN.A import A
from dns.rdtypes.IN.AAAA import AAAA
from dns.rdtypes.IN.SRV import SRV

from sentinel import telemetry
from sentinel.agent.dns.names import instance_name
from sentinel.agent.served import scaled_weights
from sentinel.eligibility import status_verdict
from sentinel.registry.endpoint import Endpoint

#: The heaviest instance's SRV weight (RFC 2782's largest).
SRV_WEIGHT_SCALE = 65535
#: Characters of one TXT string (RFC 1035: at most 255 octets).
_TXT_CHARS = 255
_IN = dns.rdataclass.IN
A_TYPE, AAAA_TYPE, SRV_TYPE, TXT_TYPE = (
    dns.rdatatype.A,
    dns.rdatatype.AAAA,
    dns.rdatatype.SRV,
    dns.rdatatype.TXT,
)


@dataclass(frozen=True, slots=True)
class Served:
    """What serves a name: the eligible ``instances`` (the registry's order), the region
    they are in (None: the agent's own), its SRV ``priority``, and ``registered``: every
    instance of the name here, eligible or not (for TXT's reasons)."""

    instances: tuple[Endpoint, ...]
    region: str | None = None
    priority: int = 0
    registered: tuple[Endpoint, ...] = ()


@dataclass(frozen=True, slots=True)
class Records:
    """An answer's sections: ``answer``, and ``additional`` (the SRV targets' addresses)."""

    answer: list[dns.rrset.RRset]
    additional: list[dns.rrset.RRset]


def address_of(instance: Endpoint) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The instance's host as an IP address, None when it is a name (left out, counted)."""
    try:
        address = ipaddress.ip_address(instance.host.removeprefix("[").removesuffix("]"))
    except ValueError:
        telemetry.AGENT_DNS_SKIPPED.inc()
        return None
    return address


def rotated(instances: tuple[Endpoint, ...], turn: int, limit: int) -> tuple[Endpoint, ...]:
    """``instances`` started at ``turn`` (modulo their number), at most ``limit`` of them."""
    if not instances:
        return instances
    start = turn % len(instances)
    return (instances[start:] + instances[:start])[:limit]


def records(
    name: dns.name.Name,
    rdtype: int,
    served: Served,
    zone: dns.name.Name,
    ttl: int,
    limit: int,
    turn: int,
) -> Records:
    """The records of type ``rdtype`` answering ``name`` (the question's own name), served
    by ``served``; empty sections when it has none of that type."""
    if rdtype == TXT_TYPE:
        return Records(_txt(name, served, ttl), [])
    instances = rotated(served.instances, turn, limit)
    if rdtype in (A_TYPE, AAAA_TYPE):
        return Records(_addresses(name, rdtype, instances, ttl), [])
    if rdtype == SRV_TYPE:
        return _srv(name, served, instances, zone, ttl)
    return Records([], [])


def _addresses(
    name: dns.name.Name, rdtype: int, instances: Sequence[Endpoint], ttl: int
) -> list[dns.rrset.RRset]:
    version = 4 if rdtype == A_TYPE else 6
    kind = A if version == 4 else AAAA
    seen: dict[str, None] = {}
    for instance in instances:
        address = address_of(instance)
        if address is not None and address.version == version:
            seen.setdefault(str(address))
    if not seen:
        return []
    return [dns.rrset.from_rdata_list(name, ttl, [kind(_IN, rdtype, a) for a in seen])]


def _srv(
    name: dns.name.Name,
    served: Served,
    instances: Sequence[Endpoint],
    zone: dns.name.Name,
    ttl: int,
) -> Records:
    weights = scaled_weights(served.instances, SRV_WEIGHT_SCALE)
    targets, additional = [], []
    for instance in instances:
        address = address_of(instance)
        if address is None:
            continue
        target = instance_name(instance.service, instance.partition, instance.label, zone)
        targets.append(
            SRV(  # type: ignore[no-untyped-call]  # dnspython's constructor is not annotated
                _IN,
                SRV_TYPE,
                served.priority,
                weights.get(instance.name, 0),
                instance.port,
                target,
            )
        )
        rdtype, kind = (A_TYPE, A) if address.version == 4 else (AAAA_TYPE, AAAA)
        additional.append(dns.rrset.from_rdata_list(target, ttl, [kind(_IN, rdtype, address)]))
    if not targets:
        return Records([], [])
    return Records([dns.rrset.from_rdata_list(name, ttl, targets)], additional)


def _txt(name: dns.name.Name, served: Served, ttl: int) -> list[dns.rrset.RRset]:
    region = served.region or "local"
    lines = [
        f"{i.name} {i.host}:{i.port} region={region} status={i.status} weight={i.weight:g} answered"
        for i in served.instances
    ]
    answered = {i.name for i in served.instances}
    for instance in (i for i in served.registered if i.name not in answered):
        why = status_verdict(instance) if instance.status != "up" else "held back or ejected"
        lines.append(f"{instance.name} {instance.host}:{instance.port} not answered: {why}")
    if not lines:
        return []
    strings = [TXT(_IN, TXT_TYPE, [line[:_TXT_CHARS].encode()]) for line in lines]
    return [dns.rrset.from_rdata_list(name, ttl, strings)]


def soa(zone: dns.name.Name, ttl: int) -> dns.rrset.RRset:
    """The zone's SOA record: what a negative answer carries in its authority section, its
    minimum the negative answer's TTL (RFC 2308): ``ttl``, as the positive answers'."""
    record = SOA(  # type: ignore[no-untyped-call]  # dnspython's constructor is not annotated
        _IN,
        dns.rdatatype.SOA,
        dns.name.Name((b"agent",)).concatenate(zone),
        dns.name.Name((b"hostmaster",)).concatenate(zone),
        1,
        3600,
        600,
        86400,
        ttl,
    )
    return dns.rrset.from_rdata_list(zone, ttl, [record])
