"""The ``health`` source: active readiness checks run by the collector, from outside.

Configuration::

    [services.source]
    type = "health"
    http = "/ready"               # a path on each instance, or a full http(s):// URL; or
    # tcp = true                  # connect to the instance's port (or tcp = 6432: that port)
    # grpc = "orders.Orders"      # its standard gRPC health service (grpc = true: the server)
    failures_before_down = 3      # default 3
    successes_before_up = 2       # default 2

The check is :class:`~sentinel.health.checks.HealthCheck`, the publisher's, run against each
instance the collector owns at the service's ``interval`` and bounded by its ``timeout``; its
results are damped per instance as the publisher damps them
(:class:`~sentinel.health.damping.Damper`). The damped state is published as the metric
``health``: 1 for up, 0 for down. A failing check is a result, not a failed collection: the
metric is published either way.

It is a metric, not the instance's status, on purpose: the instance node belongs to its
publisher (which keeps a status another client writes there as an operator's drain), a
metric is the collector's own node, and metrics carry their age, so the verdict of a
collector that stopped expires instead of holding an instance down. Policies read it:
``Threshold("health", above=0)`` keeps the instances the collector last saw up, within the
metrics' default age limit (docs/health.md).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Mapping

from sentinel import telemetry
from sentinel.collector.options import Options
from sentinel.errors import ValidationError
from sentinel.health.checks import (
    DEFAULT_FAILURES_BEFORE_DOWN,
    DEFAULT_SUCCESSES_BEFORE_UP,
    HealthCheck,
    Schedule,
)
from sentinel.health.damping import UP, Damper
from sentinel.registry.endpoint import Endpoint

log = logging.getLogger(__name__)

METRIC = "health"
# Instances whose damped state is kept; past this the least recently checked is forgotten
# (it starts again from its next result), so instances that came and went over months do
# not grow the collector.
MAX_TRACKED = 10_000
# The share of the collection's timeout the probe may use: the rest is for damping and the
# return, so that a probe that ends at its deadline is a result, not a late collection.
PROBE_SHARE = 0.9


class HealthSource:
    """Runs one :class:`HealthCheck` against each instance and publishes its damped state."""

    type = "health"

    def __init__(self, check: HealthCheck) -> None:
        self.check = check
        self._lock = threading.Lock()
        self._dampers: collections.OrderedDict[str, Damper] = collections.OrderedDict()

    @classmethod
    def from_options(cls, options: Options) -> HealthSource:
        """Read the ``[source]`` table: ``http``, ``tcp`` or ``grpc`` and the two
        thresholds."""
        http = options.string("http", None)
        tcp = options.get("tcp", None)
        grpc = options.get("grpc", None)
        given = [k for k, v in (("http", http), ("tcp", tcp), ("grpc", grpc)) if v is not None]
        if len(given) != 1:
            raise options.error(
                "http", "give exactly one of http (a path or URL), tcp and grpc (a service)"
            )
        thresholds: Schedule = {
            "failures_before_down": options.number(
                "failures_before_down", DEFAULT_FAILURES_BEFORE_DOWN, minimum=1
            ),
            "successes_before_up": options.number(
                "successes_before_up", DEFAULT_SUCCESSES_BEFORE_UP, minimum=1
            ),
        }
        try:
            if http is not None:
                check = HealthCheck.http(http, **thresholds)
            elif grpc is not None:
                check = HealthCheck.grpc("" if grpc is True else grpc, **thresholds)
            elif tcp is True:
                check = HealthCheck.tcp(**thresholds)
            elif tcp is False:
                raise options.error("tcp", "false checks nothing: leave it out")
            else:
                check = HealthCheck.tcp(tcp, **thresholds)
        except ValidationError as exc:
            raise options.error(given[0], str(exc)) from None
        return cls(check)

    def collect(self, endpoint: Endpoint, timeout: float) -> Mapping[str, int]:
        """Run the check once against ``endpoint``; ``{"health": 1}`` if its damped state is
        up, ``{"health": 0}`` if down."""
        try:
            self.check.probe(endpoint.host, endpoint.port, timeout * PROBE_SHARE)()
        except Exception as exc:
            passed, detail = False, str(exc) or type(exc).__name__
        else:
            passed, detail = True, ""
        with self._lock:
            damper = self._dampers.pop(endpoint.name, None)
            if damper is None:
                damper = Damper(self.check.failures_before_down, self.check.successes_before_up)
            self._dampers[endpoint.name] = damper  # the most recently checked last
            if len(self._dampers) > MAX_TRACKED:
                self._dampers.popitem(last=False)
            changed = damper.observe(passed)
            state = damper.state
        if changed is not None:
            source = f"collector:{self.check.kind}"
            telemetry.HEALTH_CHANGES.labels(endpoint.service, source, changed).inc()
            log.info(
                "%s/%s: %s by the collector's readiness check%s",
                endpoint.service,
                endpoint.name,
                changed,
                f" ({detail})" if detail else "",
            )
        return {METRIC: 1 if state == UP else 0}
