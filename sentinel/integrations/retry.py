"""Resolving again after an endpoint failed: the bounded retry the integrations share.

A caller that failed on an endpoint resolves again without it, so that the policy picks the
best of the others (a MinLag then picks the next least-lagging replica, not nothing); when
every eligible endpoint has failed once, a fresh resolution may find one of them back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from sentinel.errors import EndpointFailed, NoInstanceAvailable
from sentinel.plugins import as_policy
from sentinel.registry.endpoint import Endpoint

if TYPE_CHECKING:
    from sentinel.client import Sentinel
    from sentinel.strategies import Balancer, Endpoints, SelectionPolicy

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


class Route:
    """One call routed through Sentinel, as the httpx transport and the gRPC channel make it:
    the endpoint of each attempt, and what is reported of it.

    It resolves :attr:`endpoint` at once with ``client.get_service(service, key, policy,
    balancer)`` (resolution errors raised as ``get_service`` raises them). A caller marks
    :meth:`sent` when the call leaves, then reports :meth:`succeeded` (the outcome and the
    time since :meth:`sent`, which load-aware balancers read) or :meth:`failed`, which reports
    the endpoint down without a latency (the time a failure took says nothing of the
    instance's load) and, when the caller says the call may be made again, resolves another
    endpoint avoiding those that failed, at most ``retries`` times.
    """

    __slots__ = (
        "_failed",
        "_sent",
        "balancer",
        "client",
        "endpoint",
        "key",
        "policy",
        "retries",
        "service",
    )

    def __init__(
        self,
        client: Sentinel,
        service: str,
        key: object,
        policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | str | None,
        balancer: Balancer | str | None,
        retries: int,
    ) -> None:
        self.client = client
        self.service = service
        self.key = key
        self.policy = policy
        self.balancer = balancer
        self.retries = retries
        self._failed: set[str] = set()
        self._sent = 0.0
        self.endpoint = client.get_service(service, key, policy, balancer)

    def sent(self) -> None:
        """Note that the call leaves for :attr:`endpoint` now (its latency counts from here)."""
        self._sent = time.perf_counter()

    def succeeded(self, ok: bool = True, *, timed: bool = True) -> None:
        """Report the endpoint's answer: ``ok`` False counts it as a failure of the instance
        (a 5xx under ``server_errors_fail``); ``timed`` reports the time since :meth:`sent`."""
        latency = time.perf_counter() - self._sent if timed else None
        self.client.report(self.endpoint, ok=ok, latency=latency)

    def failed(self, what: str, error: str, may_retry: bool) -> bool:
        """Report :attr:`endpoint` down after ``error`` (a name for the log) on ``what`` (the
        call, for the log); when ``may_retry`` and attempts are left, resolve another eligible
        endpoint as :attr:`endpoint`. Returns whether to make the call again there."""
        failed = self.endpoint
        self.client.report(failed, ok=False)
        self._failed.add(failed.name)
        retry = may_retry and len(self._failed) <= self.retries
        if retry:
            try:
                self.endpoint = self.client.get_service(
                    self.service,
                    self.key,
                    without(self.policy, frozenset(self._failed)),
                    self.balancer,
                )
            except NoInstanceAvailable:
                retry = False
        log.warning(
            "%s: %s on %s failed (%s)%s",
            self.service,
            what,
            failed.name,
            error,
            f"; trying {self.endpoint.name}" if retry else "",
        )
        return retry
