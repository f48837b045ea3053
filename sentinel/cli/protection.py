"""What ``/clients`` entries say of protection from mass loss, as far as they can be trusted
(``sentinel ls SERVICE`` and ``sentinel doctor``).

A client in a protection episode writes ``protecting`` (how many instances it serves that the
registry no longer lists) and ``protecting_since`` into its ``/clients/<service>`` entry. Anyone
may add an entry there (``init --secure`` grants CREATE to all), so a claim counts only when:

- its entry is attributable: in a secured namespace, ephemeral and written by the identity
  enrolled for the client it names, read as rotations and ``sentinel auth status`` read them
  (:class:`~sentinel.auth.manager.ClientEntries`); in an open namespace anyone may write any
  entry, and an entry counts as its client's;
- it is not marked ``left``;
- the registry allows it: only services whose spec marks departures are ever protected
  (:mod:`sentinel.cache.protection`), so a claim about another is not counted.

Entries that count for nobody are reported (how many, and why), never summed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.security import Id

from sentinel.auth.manager import ClientEntries
from sentinel.registry.records import ServiceSpec

# An entry of a process that left counts for nobody, and is no one's forgery either.
_LEFT = "left"
UNMARKED = "claims protection of a service whose spec does not mark departures"


@dataclass(frozen=True)
class ProtectionClaims:
    """``clients``: the counted claims, ``{"client", "instances", "since"}`` each (by node
    name); ``ignored``: why entries were not counted -> how many (entries of processes that
    left are not listed)."""

    clients: list[dict[str, Any]]
    ignored: dict[str, int]


def protection_claims(
    zk: KazooClient, spec: ServiceSpec, owners: Mapping[str, Id | None] | None
) -> ProtectionClaims:
    """The clients that serve instances of ``spec``'s service the registry no longer lists,
    as their attributable ``/clients`` entries say, and the entries not counted. ``owners``:
    :func:`~sentinel.auth.manager.enrolled_owners` (None in an open namespace)."""
    census = ClientEntries(zk, spec.service, owners=owners).read()
    ignored = {why: n for why, n in census.ignored.items() if why != _LEFT}
    clients = []
    for name, record in sorted(census.records.items()):
        if not record.protecting or record.left is not None:
            continue
        if not spec.mark_departures:
            ignored[UNMARKED] = ignored.get(UNMARKED, 0) + 1
            continue
        clients.append(
            {"client": name, "instances": record.protecting, "since": record.protecting_since}
        )
    return ProtectionClaims(clients, ignored)


def ignored_note(service: str, ignored: dict[str, int]) -> str:
    """One line for operators: the entries under ``/clients/<service>`` counted for nobody."""
    reasons = "; ".join(f"{why}: {n}" for why, n in sorted(ignored.items()))
    return (
        f"{sum(ignored.values())} entries under /clients/{service} count for no process "
        f"({reasons}): what they say, protection from mass loss included, is not counted"
    )
