"""Resolving again after an endpoint failed: the bounded retry the integrations share.

A caller that failed on an endpoint resolves again without it, so that the policy picks the
best of the others (a MinLag then picks the next least-lagging replica, not nothing); when
every eligible endpoint has failed once, a fresh resolution may find one of them back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from sentinel.endpoint import Endpoint
from sentinel.errors import EndpointFailed, NoInstanceAvailable

if TYPE_CHECKING:
    from sentinel.client import Sentinel
    from sentinel.strategies import Endpoints, SelectionPolicy

log = logging.getLogger(__name__)

Result = TypeVar("Result")


def without(
    policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | None, failed: frozenset[str]
) -> Callable[[Endpoints], Endpoints]:
    """``policy`` over the endpoints whose names are not in ``failed`` (filtered before it)."""

    def select(endpoints: Endpoints) -> Endpoints:
        kept = tuple(e for e in endpoints if e.name not in failed)
        return policy(kept) if policy is not None and kept else kept

    return select


def resolve_avoiding(
    client: Sentinel,
    service: str,
    key: object,
    policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | None,
    failed: frozenset[str],
) -> Endpoint:
    """``client.get_service(service, key, policy)`` skipping the endpoints named in ``failed``,
    unless that leaves none."""
    if not failed:
        return client.get_service(service, key, policy)
    try:
        return client.get_service(service, key, without(policy, failed))
    except NoInstanceAvailable:
        return client.get_service(service, key, policy)


def first_success(
    client: Sentinel,
    service: str,
    key: object,
    policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | None,
    attempt: Callable[[Endpoint], Result],
    *,
    retries: int,
    retry_on: tuple[type[BaseException], ...],
) -> Result:
    """``attempt(endpoint)`` on a resolved endpoint; when it raises one of ``retry_on``, the
    endpoint is reported down (``client.report(endpoint, ok=False)``) and the attempt made
    again on another one, at most ``retries`` more times, then
    :class:`~sentinel.errors.EndpointFailed` is raised from the last failure.
    """
    failed: frozenset[str] = frozenset()
    attempts = 0
    while True:
        attempts += 1
        endpoint = resolve_avoiding(client, service, key, policy, failed)
        try:
            return attempt(endpoint)
        except retry_on as exc:
            client.report(endpoint, ok=False)
            failed |= {endpoint.name}
            if attempts > retries:
                raise EndpointFailed(
                    f"{service}: {attempts} attempt(s) failed, the last on {endpoint.name} "
                    f"({type(exc).__name__})"
                ) from exc
            log.warning(
                "%s: %s failed (%s); resolving again", service, endpoint.name, type(exc).__name__
            )
