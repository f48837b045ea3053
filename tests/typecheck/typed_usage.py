"""A small typed program against the public API; tests/unit/test_typing.py runs mypy on it.

It is checked, not run: it shows what a user's type checker sees of ``sentinel``.
"""

from __future__ import annotations

from sentinel import (
    Endpoint,
    InstancesChanged,
    Registration,
    ResolutionError,
    Sentinel,
    SentinelError,
    ZooKeeperUnavailable,
)
from sentinel.aio import AsyncSentinel, EventsMissed
from sentinel.events import ChangeEvent
from sentinel.registry.records import MetricsRecord
from sentinel.strategies import Balancer, Endpoints, SelectionPolicy


class InZone(SelectionPolicy):
    """Instances in one zone."""

    pure = True

    def __init__(self, zone: str) -> None:
        self.zone = zone

    def select(self, endpoints: Endpoints) -> Endpoints:
        return tuple(e for e in endpoints if e.zone == self.zone)


class First(Balancer):
    """Always the first eligible instance."""

    def pick(self, endpoints: Endpoints) -> Endpoint:
        return endpoints[0]


def address(endpoint: Endpoint) -> tuple[str, int]:
    return endpoint.host, endpoint.port


joined: list[Endpoint] = []


def on_change(event: ChangeEvent) -> None:
    if isinstance(event, InstancesChanged):
        joined.extend(event.added)


def serve(hosts: str) -> Registration:
    with Sentinel(hosts=hosts, client_id="billing-api") as sentinel:
        registration: Registration = sentinel.register(
            "billing-db", "p1", "10.0.0.5", 5432, scheme="postgresql"
        )
        stop = sentinel.listen("billing-db", on_change)
        stop()
        return registration


def lookup(sentinel: Sentinel, tenant: str) -> str | None:
    try:
        endpoint = sentinel.get_service(
            "billing-db", key=tenant, policy=InZone("eu"), balancer=First()
        )
    except ResolutionError as exc:
        missing: str | None = exc.partition
        return missing
    except ZooKeeperUnavailable:
        return None
    except SentinelError:
        raise
    host, port = address(endpoint)
    every: tuple[Endpoint, ...] = sentinel.eligible_instances("billing-db", key=tenant)
    return f"{endpoint.uri} {host}:{port + 1} of {len(every)}"


async def serve_async(hosts: str) -> int:
    async with AsyncSentinel(hosts=hosts, client_id="billing-api") as client:
        registration: Registration = await client.register(
            "billing-db", "p1", "10.0.0.5", 5432, scheme="postgresql"
        )
        record: MetricsRecord = await client.update_metrics(registration, {"lag": 2.5})
        await client.update_metrics("billing-db", "p1", record.label, {"lag": 1.0})
        await client.prefetch("billing-db")
        endpoint: Endpoint = client.get_service("billing-db", key="acme")
        async with client.events("billing-db") as events:
            async for event in events:
                if isinstance(event, EventsMissed):
                    return event.count
                on_change(event)
        removed: bool = await client.deregister(registration, wait=0.5)
        assert removed
        return endpoint.port
