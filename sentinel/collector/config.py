"""A metric collector's configuration: TOML (or YAML), validated before anything runs.

Example (TOML; the YAML form has the same structure)::

    cluster = "eu-1"              # collectors with the same cluster share the instances
    workers = 16                  # collections in flight at most (default 16)

    [[services]]
    service = "billing-db"
    interval = "5s"               # per instance; seconds, or "500ms", "5s", "2m"
    jitter = "500ms"              # +/- uniform, spreads collections (default interval/10)
    timeout = "2s"                # per collection (default: the smaller of 5 s and interval)
    partitions = ["p1", "p2"]     # only these partitions (default: all)
    [services.source]
    type = "postgres"             # prometheus, postgres, command or python

Every error names the file, the entry and the field (a :class:`~sentinel.errors.ValidationError`).
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentinel.collector.options import Options
from sentinel.collector.source import Source, build_source
from sentinel.errors import ValidationError
from sentinel.freshness import DEFAULT_COLLECT_INTERVAL
from sentinel.registry.layout import DEFAULT_COLLECTOR_CLUSTER, validate_name

# Defined with the staleness it sets (sentinel.freshness): metrics older than three intervals
# are not trusted, so the two must change together.
DEFAULT_INTERVAL = DEFAULT_COLLECT_INTERVAL
DEFAULT_TIMEOUT = 5.0
DEFAULT_WORKERS = 16
DEFAULT_CLUSTER = DEFAULT_COLLECTOR_CLUSTER


@dataclass(frozen=True)
class ServiceCollection:
    """How one service's instances are collected."""

    service: str
    source: Source
    interval: float
    jitter: float
    timeout: float
    partitions: frozenset[str] | None = None

    def wants(self, partition: str) -> bool:
        """Whether instances of ``partition`` are collected."""
        return self.partitions is None or partition in self.partitions


@dataclass(frozen=True)
class CollectorConfig:
    """A whole configuration: the cluster to join and the services to collect.

    ``digest`` names what the members of a cluster must agree on (every setting but
    ``workers``, which may differ by host): a member whose digest differs from its cluster's
    takes no work (see :mod:`sentinel.collector.runner`). :func:`parse_config` computes it;
    a configuration built in code gives its own, or shares the empty one with its peers.
    """

    services: tuple[ServiceCollection, ...]
    cluster: str = DEFAULT_CLUSTER
    workers: int = DEFAULT_WORKERS
    digest: str = ""


def config_digest(document: dict[str, Any]) -> str:
    """A short digest of what a cluster's members must agree on: the document, keys sorted,
    without ``workers``. Two files that parse to the same settings, spelled alike, agree."""
    shared = {key: value for key, value in document.items() if key != "workers"}
    text = json.dumps(shared, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def load_config(path: str | Path) -> CollectorConfig:
    """Read and validate a ``.toml``, ``.yaml`` or ``.yml`` file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError(f"cannot read {path}: {exc}") from None
    if path.suffix == ".toml":
        try:
            document: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValidationError(f"{path} is not valid TOML: {exc}") from None
    elif path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValidationError(f"{path} is not valid YAML: {exc}") from None
    else:
        raise ValidationError(f"{path}: the file name must end in .toml, .yaml or .yml")
    return parse_config(document, str(path))


def parse_config(document: object, where: str = "config") -> CollectorConfig:
    """Validate a decoded document; raise ValidationError naming what is wrong."""
    top = Options(document, where)
    cluster = _name(top, "cluster", top.string("cluster", DEFAULT_CLUSTER))
    workers = int(top.number("workers", DEFAULT_WORKERS, minimum=1))
    entries = top.get("services")
    if not isinstance(entries, list) or not entries:
        raise top.error("services", "expected a non-empty list of [[services]] tables")
    services = tuple(_service(Options(e, f"{where}: services[{i}]")) for i, e in enumerate(entries))
    names = [s.service for s in services]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValidationError(f"{where}: service(s) listed twice: {', '.join(repeated)}")
    top.finish()
    assert isinstance(document, dict)  # Options refused anything else
    return CollectorConfig(
        services=services, cluster=cluster, workers=workers, digest=config_digest(document)
    )


def _name(options: Options, key: str, value: str) -> str:
    try:
        return validate_name(key, value)
    except ValidationError as exc:
        raise options.error(key, str(exc)) from None


def _service(options: Options) -> ServiceCollection:
    service = _name(options, "service", options.string("service"))
    options.where = f"{options.where} ({service})"
    interval = options.duration("interval", DEFAULT_INTERVAL)
    jitter = options.duration("jitter", interval / 10, positive=False)
    if jitter >= interval:
        raise options.error("jitter", f"{jitter:g}s must be less than the interval ({interval:g}s)")
    timeout = options.duration("timeout", min(DEFAULT_TIMEOUT, interval))
    if timeout > interval:
        raise options.error("timeout", f"{timeout:g}s must not exceed the interval ({interval:g}s)")
    partitions = options.strings("partitions", None)
    source = build_source(options.table_of("source"))
    options.finish()
    return ServiceCollection(
        service=service,
        source=source,
        interval=interval,
        jitter=jitter,
        timeout=timeout,
        partitions=None if partitions is None else frozenset(partitions),
    )
