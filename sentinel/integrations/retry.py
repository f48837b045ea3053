"""Resolving again after an endpoint failed: the bounded retry the integrations share.

A caller that failed on an endpoint resolves again without it, so that the policy picks the
best of the others (a MinLag then picks the next least-lagging replica, not nothing); when
every eligible endpoint has failed once, a fresh resolution may find one of them back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from sentinel.errors import EndpointFailed, NoInstanceAvailable
from sentinel.plugins import as_policy
from sentinel.registry.endpoint import Endpoint

if TYPE_CHECKING:
    from sentinel.client import Sentinel
    from sentinel.strategies import Endpoints, SelectionPolicy

log = logging.getLogger(__name__)

Result = TypeVar("Result")


def without(
    policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | str | None,
    failed: frozenset[str],
) -> Callable[[Endpoints], Endpoints]:
    """``policy`` (an instance or a registered name) over the endpoints whose names are not in
    ``failed`` (filtered before it)."""
    resolved = None if policy is None else as_policy(policy)

    def select(endpoints: Endpoints) -> Endpoints:
        kept = tuple(e for e in endpoints if e.name not in failed)
        return resolved(kept) if resolved is not None and kept else kept

    return select


def resolve_avoiding(
    client: Sentinel,
    service: str,
    key: object,
    policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | str | None,
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


class Attempts:
    """The state of one bounded retry: which endpoint to try next, and what a failure does.

    A caller loops: ``endpoint = attempts.next()``, try it, and on a failure
    ``attempts.failed(endpoint, exc)``, which reports the endpoint down
    (``client.report(endpoint, ok=False)``) and, once ``retries`` more attempts have failed,
    raises :class:`~sentinel.errors.EndpointFailed` from ``exc``. The same loop serves
    blocking and ``await``-ing callers (see :func:`first_success`).
    """

    def __init__(
        self,
        client: Sentinel,
        service: str,
        key: object,
        policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | str | None,
        retries: int,
    ) -> None:
        self.client = client
        self.service = service
        self.key = key
        self.policy = policy
        self.retries = retries
        self.made = 0
        self._failed: frozenset[str] = frozenset()

    def next(self) -> Endpoint:
        """The endpoint of the next attempt, avoiding those that failed."""
        self.made += 1
        return resolve_avoiding(self.client, self.service, self.key, self.policy, self._failed)

    def failed(self, endpoint: Endpoint, exc: BaseException) -> None:
        """Report ``endpoint`` down; raise EndpointFailed when no attempt is left."""
        self.client.report(endpoint, ok=False)
        self._failed |= {endpoint.name}
        if self.made > self.retries:
            raise EndpointFailed(
                f"{self.service}: {self.made} attempt(s) failed, the last on {endpoint.name} "
                f"({type(exc).__name__})"
            ) from exc
        log.warning(
            "%s: %s failed (%s); resolving again", self.service, endpoint.name, type(exc).__name__
        )


def first_success(
    client: Sentinel,
    service: str,
    key: object,
    policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | str | None,
    attempt: Callable[[Endpoint], Result],
    *,
    retries: int,
    retry_on: tuple[type[BaseException], ...],
) -> Result:
    """``attempt(endpoint)`` on a resolved endpoint; when it raises one of ``retry_on``, the
    endpoint is reported down and the attempt made again on another one, at most ``retries``
    more times (see :class:`Attempts`)."""
    attempts = Attempts(client, service, key, policy, retries)
    while True:
        endpoint = attempts.next()
        try:
            return attempt(endpoint)
        except retry_on as exc:
            attempts.failed(endpoint, exc)
