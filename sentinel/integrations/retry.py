"""The one retry route of the integrations: which endpoint each attempt goes to, and what is
reported of it (docs/decisions/one-bounded-retry-shared.md).

The httpx transport, the gRPC channel, the PostgreSQL connections and pools and the Spark
helpers all retry through :class:`Route`. After a failure that the caller says may be
repeated, the endpoint is reported down and the call resolved again without the endpoints
that failed (filtered before the policy, so that a MinLag picks the next least-lagging
replica, not nothing); when every eligible endpoint has failed once, the policy picks among
them all again (a fresh resolution may find one back, as Envoy's ``previous_hosts`` retry
predicate falls back to a previous host). At most ``retries`` more attempts are made. What is
raised when none is left is the integration's: the transports raise the last error of their
library (what httpx and gRPC code catches), the connection helpers
:class:`~sentinel.errors.EndpointFailed` from it (:meth:`Route.exhausted`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from sentinel.errors import EndpointFailed, NoInstanceAvailable
from sentinel.plugins import as_policy

if TYPE_CHECKING:
    from sentinel.client import Sentinel
    from sentinel.registry.endpoint import Endpoint
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


class Route:
    """One call routed through Sentinel: the endpoint of each attempt, and what is reported.

    It resolves :attr:`endpoint` at once with ``client.get_service(service, key, policy,
    balancer)`` (resolution errors raised as ``get_service`` raises them). A caller marks
    :meth:`sent` when the call leaves, then reports :meth:`succeeded` (the outcome and the
    time since :meth:`sent`, which load-aware balancers read) or :meth:`failed`, which reports
    the endpoint down without a latency (the time a failure took says nothing of the
    instance's load) and, when the caller says the call may be made again and fewer than
    ``retries`` retries were made, resolves the next :attr:`endpoint` (see the module's
    documentation). The loop is the same few lines for blocking and ``await``-ing callers::

        route = Route(client, service, key, policy, retries=2)
        while True:
            try:
                return attempt(route.endpoint)
            except OperationalError as exc:
                if not route.failed("connect", type(exc).__name__):
                    raise route.exhausted(exc) from exc
    """

    __slots__ = (
        "_failed",
        "_sent",
        "attempts",
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
        policy: SelectionPolicy | Callable[[Endpoints], Endpoints] | str | None = None,
        balancer: Balancer | str | None = None,
        retries: int = 0,
    ) -> None:
        self.client = client
        self.service = service
        self.key = key
        self.policy = policy
        self.balancer = balancer
        self.retries = retries
        #: Attempts made so far (the one on :attr:`endpoint` included).
        self.attempts = 1
        self._failed: frozenset[str] = frozenset()
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

    def failed(self, what: object, error: str, may_retry: bool = True) -> bool:
        """Report :attr:`endpoint` down after ``error`` (a name for the log) on ``what`` (the
        call, for the log); when ``may_retry`` and a retry is left, resolve the next
        :attr:`endpoint`. Returns whether to make the call again there."""
        failed = self.endpoint
        self.client.report(failed, ok=False)
        self._failed |= {failed.name}
        retry = may_retry and self.attempts <= self.retries and self._next()
        log.warning(
            "%s: %s on %s failed (%s)%s",
            self.service,
            what,
            failed.name,
            error,
            f"; trying {self.endpoint.name}" if retry else "",
        )
        return retry

    def _next(self) -> bool:
        """Resolve the next attempt's endpoint; False when the service has none left."""
        client, service, key = self.client, self.service, self.key
        try:
            try:
                endpoint = client.get_service(
                    service, key, without(self.policy, self._failed), self.balancer
                )
            except NoInstanceAvailable:  # every eligible one failed once: any may be back
                endpoint = client.get_service(service, key, self.policy, self.balancer)
        except NoInstanceAvailable:
            return False
        self.endpoint = endpoint
        self.attempts += 1
        return True

    def exhausted(self, exc: BaseException) -> EndpointFailed:
        """The :class:`~sentinel.errors.EndpointFailed` a caller raises from ``exc`` when
        :meth:`failed` said not to try again."""
        return EndpointFailed(
            f"{self.service}: {self.attempts} attempt(s) failed, the last on "
            f"{self.endpoint.name} ({type(exc).__name__})"
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
    endpoint is reported down and the attempt made again on the next one (:class:`Route`), at
    most ``retries`` more times, then :class:`~sentinel.errors.EndpointFailed` is raised from
    the last failure."""
    route = Route(client, service, key, policy, retries=retries)
    while True:
        try:
            return attempt(route.endpoint)
        except retry_on as exc:
            if not route.failed("attempt", type(exc).__name__):
                raise route.exhausted(exc) from exc
