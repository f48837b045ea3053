"""The ``prometheus`` source: scrape an instance's exposition endpoint, keep chosen samples.

Configuration::

    [services.source]
    type = "prometheus"
    path = "/metrics"             # default
    port = 9187                   # default: the instance's own port
    scheme = "http"               # default
    [services.source.metrics]     # published name = sample selector
    replication_lag = "pg_replication_lag_seconds"
    queue = 'mail_queue_messages{queue="active"}'

A selector is a sample name with optional labels; it must match exactly one sample (labels
not named in the selector may take any value), so a selector that suddenly matches two series
fails loudly instead of publishing an arbitrary one.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import parse_labels, text_string_to_metric_families

from sentinel.collector.options import Options
from sentinel.endpoint import Endpoint, format_uri
from sentinel.errors import SourceError, SourceTimeout

MAX_EXPOSITION_BYTES = 16 * 1024 * 1024
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\Z", re.DOTALL)


@dataclass(frozen=True)
class Selector:
    """A sample name and the labels a sample must carry."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Selector:
        """Parse ``name`` or ``name{label="value",...}``; ValueError if malformed."""
        match = _SELECTOR.match(text.strip())
        if not match:
            raise ValueError(f"{text!r} is not a sample selector such as 'name{{label=\"v\"}}'")
        labels = parse_labels(match.group(2)) if match.group(2) else {}
        return cls(match.group(1), tuple(sorted(labels.items())))

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        """Whether a sample is selected."""
        return name == self.name and all(labels.get(k) == v for k, v in self.labels)


class PrometheusSource:
    """Scrapes ``scheme://host:port/path`` of each instance."""

    type = "prometheus"

    def __init__(
        self,
        metrics: Mapping[str, Selector],
        path: str = "/metrics",
        port: int | None = None,
        scheme: str = "http",
    ) -> None:
        self.metrics = dict(metrics)
        self.path = path
        self.port = port
        self.scheme = scheme

    @classmethod
    def from_options(cls, options: Options) -> PrometheusSource:
        """Read the ``[source]`` table."""
        table = options.table_of("metrics")
        selectors = {}
        for name, text in table.table.items():
            if not isinstance(text, str):
                raise table.error(name, f"expected a sample selector string, got {text!r}")
            try:
                selectors[name] = Selector.parse(text)
            except ValueError as exc:
                raise table.error(name, str(exc)) from None
        if not selectors:
            raise options.error("metrics", "name at least one metric to publish")
        path = options.string("path", "/metrics")
        if not path.startswith("/"):
            raise options.error("path", f"{path!r} must start with '/'")
        port = options.number("port", None, minimum=1)
        scheme = options.string("scheme", "http")
        if scheme not in ("http", "https"):
            raise options.error("scheme", f"{scheme!r} is not http or https")
        return cls(selectors, path, None if port is None else int(port), scheme)

    def url(self, endpoint: Endpoint) -> str:
        """Where ``endpoint``'s metrics are exposed."""
        return format_uri(self.scheme, endpoint.host, self.port or endpoint.port) + self.path

    def collect(self, endpoint: Endpoint, timeout: float) -> dict[str, float]:
        """Scrape once and pick the selected samples."""
        url = self.url(endpoint)
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                text = response.read(MAX_EXPOSITION_BYTES).decode("utf-8", "replace")
        except TimeoutError:
            raise SourceTimeout(f"{url} did not answer within {timeout:g}s") from None
        except (OSError, urllib.error.URLError) as exc:
            if isinstance(getattr(exc, "reason", None), TimeoutError):
                raise SourceTimeout(f"{url} did not answer within {timeout:g}s") from None
            raise SourceError(f"cannot scrape {url}: {exc}") from None
        try:
            samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
        except ValueError as exc:
            raise SourceError(f"{url} is not Prometheus text exposition: {exc}") from None
        values = {}
        for metric, selector in self.metrics.items():
            found = [s.value for s in samples if selector.matches(s.name, s.labels)]
            if len(found) != 1:
                raise SourceError(
                    f"{url}: selector for {metric!r} matched {len(found)} samples, not 1"
                )
            values[metric] = found[0]
        return values
