"""What a metric source is, and how a configuration names one.

A source collects the run-time metrics of one instance: ``collect(endpoint, timeout)`` returns
a mapping of metric name to number or string, raises :class:`~sentinel.errors.SourceTimeout`
when the instance did not answer in time and :class:`~sentinel.errors.SourceError` for any
other failure. It must honour ``timeout`` itself (socket and process timeouts): the runner
never waits for it, but a source that overruns holds a worker thread meanwhile.

Built-in sources, one module each: ``prometheus``, ``postgres``, ``command``, ``python`` (a
callable of your own, the plug-in point).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import Protocol

from sentinel.collector.options import Options
from sentinel.endpoint import Endpoint
from sentinel.records import MetricValue

SOURCE_TYPES = {
    "command": "sentinel.collector.command:CommandSource",
    "postgres": "sentinel.collector.postgres:PostgresSource",
    "prometheus": "sentinel.collector.prometheus:PrometheusSource",
    "python": "sentinel.collector.plugin:PythonSource",
}


class Source(Protocol):
    """The interface of a metric source."""

    type: str

    def collect(self, endpoint: Endpoint, timeout: float) -> Mapping[str, MetricValue]:
        """The instance's metrics now; raise SourceError or SourceTimeout on failure."""
        ...


def build_source(options: Options) -> Source:
    """The source a ``[source]`` table describes (its ``type`` picks the kind)."""
    kind = options.string("type")
    if kind not in SOURCE_TYPES:
        raise options.error("type", f"unknown source {kind!r}; known: {', '.join(SOURCE_TYPES)}")
    module, _, name = SOURCE_TYPES[kind].partition(":")
    source: Source = getattr(import_module(module), name).from_options(options)
    options.finish()
    return source


def instance_environment(endpoint: Endpoint) -> dict[str, str]:
    """The instance's fields as ``SENTINEL_*`` variables (for commands and plug-ins)."""
    return {
        "SENTINEL_SERVICE": endpoint.service,
        "SENTINEL_PARTITION": endpoint.partition,
        "SENTINEL_LABEL": endpoint.label,
        "SENTINEL_INSTANCE": endpoint.name,
        "SENTINEL_SCHEME": endpoint.scheme,
        "SENTINEL_HOST": endpoint.host,
        "SENTINEL_PORT": str(endpoint.port),
        "SENTINEL_URI": endpoint.uri,
        "SENTINEL_STATUS": endpoint.status,
        "SENTINEL_ZONE": endpoint.zone or "",
    }
