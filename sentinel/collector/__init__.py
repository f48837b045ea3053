"""Metric collectors: publish each instance's run-time metrics into ``/metrics``.

A collector reads a configuration (:func:`load_config`), joins a collector cluster, and
collects the instances it owns from pluggable sources (:mod:`sentinel.collector.source`) on
behalf of the instances, so that selection policies such as ``MinLag`` can use them::

    config = load_config("collector.toml")
    with Sentinel(client_id="collector-1") as sentinel, MetricCollector(sentinel, config):
        ...

``sentinel collector run --config FILE`` runs one as a daemon (``docs/collector.md``).
"""

from sentinel.collector.config import CollectorConfig, ServiceCollection, load_config, parse_config
from sentinel.collector.runner import MetricCollector, member_service

__all__ = [
    "CollectorConfig",
    "MetricCollector",
    "ServiceCollection",
    "load_config",
    "member_service",
    "parse_config",
]
