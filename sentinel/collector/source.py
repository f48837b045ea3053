"""What a metric source is, and how a configuration names one.

A source collects the run-time metrics of one instance: ``collect(endpoint, timeout)`` returns
a mapping of metric name to number or string, raises :class:`~sentinel.errors.SourceTimeout`
when the instance did not answer in time and :class:`~sentinel.errors.SourceError` for any
other failure. It must honour ``timeout`` itself (socket and process timeouts): the runner
never waits for it, but a source that overruns holds a worker thread meanwhile.

Built-in sources, one module each: ``prometheus``, ``postgres``, ``command``, ``health`` (a
readiness check, run from outside), ``python`` (a callable of your own, the plug-in point).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import Protocol

from sentinel.collector.options import Options
from sentinel.registry.endpoint import Endpoint
from sentinel.registry.records import MetricValue

SOURCE_TYPES = {
    "command": "sentinel.collector.command:CommandSource",
    "postgres": "sentinel.collector.postgres:PostgresSource",
    "prometheus": "sentinel.collector.prometheus:PrometheusSource",
    "python": "sentinel.collector.plugin:PythonSource",
    "health": "sentinel.collector.health:HealthSource",
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
    """The instance's plain fields of :meth:`Endpoint.to_dict` as ``SENTINEL_<FIELD>``
    variables (for commands and plug-ins); its ``name`` is ``SENTINEL_INSTANCE``, a field that
    is None is empty. Mappings (properties, metrics) are left out: a command that needs them
    reads them itself."""
    environment = {}
    for field, value in endpoint.to_dict().items():
        if isinstance(value, Mapping):
            continue
        variable = "SENTINEL_INSTANCE" if field == "name" else f"SENTINEL_{field.upper()}"
        environment[variable] = "" if value is None else str(value)
    return environment
