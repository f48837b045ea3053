"""Which region a client is in and how it reaches the others: plain values, one parser.

ZooKeeper does not stretch across a WAN, so each region runs its own ensemble. A client names
its own region and the others (:class:`Regions`), each one a :class:`Region`: the ensemble's
connect string, the namespace, TLS and the digest identity to use there. The same values are
built three ways, and all three go through :meth:`Regions.parse`, so a region file that works
for the CLI works for a service:

- in code: ``Sentinel(regions=Regions("east", [Region("east", "zk-e:2181"), Region("west",
  "zk-w:2181", tls=TlsConfig(ca="/etc/zk/west-ca.pem"))]))``;
- in the environment: ``$SENTINEL_REGION`` (this client's region) and ``$SENTINEL_REGIONS``
  (a JSON document, or the path of a file holding one), read by :meth:`Regions.from_env`;
- on the command line: ``--region`` and ``--regions``, with the same two variables as
  defaults (:meth:`Regions.from_text`).

The document::

    {"local": "east",
     "regions": {
       "east": {"hosts": "zk-e1:2181,zk-e2:2181"},
       "west": {"hosts": "zk-w1:2281", "namespace": "/sentinel",
                "tls": {"ca": "/etc/zk/west-ca.pem"},
                "identity_env": "SENTINEL_ZK_IDENTITY_WEST"}}}

A document never holds a password: ``identity_env`` names the variable that does (as
``$SENTINEL_ZK_IDENTITY`` does for one ensemble). ``$SENTINEL_REGION`` overrides ``local``,
so one file serves every region. Everything is checked where it is built; what is wrong raises
:class:`~sentinel.errors.RegionConfigError` naming the field (``regions.west.hosts``), and
nothing is half-built. Nothing here connects: sessions to other regions are opened by the
client, lazily, when a service may fail over to them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sentinel.devserver import validate_hosts
from sentinel.errors import RegionConfigError, ValidationError
from sentinel.regions.identity import identity_for
from sentinel.registry.failover import Failover
from sentinel.registry.layout import DEFAULT_NAMESPACE, validate_name, validate_namespace
from sentinel.suggestions import close_matches, did_you_mean
from sentinel.zk.tls import TlsConfig

#: This client's region (overrides the document's ``local``).
REGION_ENV = "SENTINEL_REGION"
#: The regions: a JSON document, or the path of a file holding one.
REGIONS_ENV = "SENTINEL_REGIONS"

#: A regions document is a small file written by an operator; one larger than this is a
#: mistake (a wrong path), refused before it is parsed.
MAX_DOCUMENT_BYTES = 64 * 1024
#: Regions in one configuration, at most: each may cost a session.
MAX_REGIONS = 64

_REGION_KEYS = frozenset({"hosts", "namespace", "tls", "identity_env"})
_TLS_KEYS = {"ca": "ca", "cert": "certfile", "key": "keyfile", "check_hostname": "check_hostname"}


@contextmanager
def _field(name: str) -> Iterator[None]:
    """Turn a ValidationError raised while checking ``name`` into one naming the field."""
    try:
        yield
    except RegionConfigError:
        raise
    except ValidationError as exc:
        raise RegionConfigError(str(exc), field=name) from None


@dataclass(frozen=True)
class Region:
    """One region: its name and how to reach its ensemble.

    ``hosts``: the ensemble's connect string (``host:port,...``). ``namespace``: the root
    Sentinel's nodes live under there. ``tls``: a :class:`~sentinel.zk.tls.TlsConfig` (None:
    plain TCP). ``identity``: the digest identity (``user:password``) of a secured namespace
    there; never shown in the repr.
    """

    name: str
    hosts: str
    namespace: str = DEFAULT_NAMESPACE
    tls: TlsConfig | None = None
    identity: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        with _field("name"):
            validate_name("region", self.name)
        where = f"regions.{self.name}"
        with _field(f"{where}.hosts"):
            validate_hosts(self.hosts, f"region {self.name!r} hosts")
        with _field(f"{where}.namespace"):
            validate_namespace(self.namespace)
        if self.tls is not None and not isinstance(self.tls, TlsConfig):
            raise RegionConfigError(
                f"must be a TlsConfig or None, not {type(self.tls).__name__}", field=f"{where}.tls"
            )
        if self.identity is not None and (
            not isinstance(self.identity, str) or ":" not in self.identity
        ):
            raise RegionConfigError(
                "must be 'user:password' (the digest identity of that region's namespace)",
                field=f"{where}.identity",
            )

    @classmethod
    def from_document(
        cls, name: str, document: object, env: Mapping[str, str] | None = None
    ) -> Region:
        """A region from its entry in a regions document (``identity_env`` read from ``env``,
        default ``os.environ``)."""
        where = f"regions.{name}"
        if not isinstance(document, dict):
            raise RegionConfigError(
                f"must be an object, not {type(document).__name__}", field=where
            )
        unknown = sorted(set(document) - _REGION_KEYS)
        if unknown:
            raise RegionConfigError(
                f"unknown field(s) {unknown}; a region has {sorted(_REGION_KEYS)} (a password "
                "never goes in the document: identity_env names the variable holding it)",
                field=where,
            )
        if "hosts" not in document:
            raise RegionConfigError(
                "missing: the ensemble's connect string", field=f"{where}.hosts"
            )
        identity = None
        variable = document.get("identity_env")
        if variable is not None:
            if not isinstance(variable, str) or not variable:
                raise RegionConfigError(
                    "must name an environment variable", field=f"{where}.identity_env"
                )
            identity = (os.environ if env is None else env).get(variable) or None
            if identity is None:
                raise RegionConfigError(f"${variable} is not set", field=f"{where}.identity_env")
        return cls(
            name=name,
            hosts=document["hosts"],
            namespace=document.get("namespace", DEFAULT_NAMESPACE),
            tls=_tls(document.get("tls"), f"{where}.tls"),
            identity=identity,
        )


def _unknown(name: str, known: Iterable[str]) -> str:
    """Why region ``name`` is refused: the regions configured, and the one meant if close."""
    names = sorted(known)
    hint = did_you_mean(close_matches(name, names))
    return f"no region {name!r}; configured: {names}" + (f"; {hint}" if hint else "")


def _tls(document: object, where: str) -> TlsConfig | None:
    if document is None or document is False:
        return None
    if document is True:
        return TlsConfig()
    if not isinstance(document, dict) or not set(document) <= set(_TLS_KEYS):
        raise RegionConfigError(
            f"must be true, false or an object of {sorted(_TLS_KEYS)}", field=where
        )
    for key, value in document.items():
        ok = isinstance(value, bool) if key == "check_hostname" else isinstance(value, str)
        if not ok:
            raise RegionConfigError(f"wrong type {type(value).__name__}", field=f"{where}.{key}")
    with _field(where):
        return TlsConfig(**{_TLS_KEYS[k]: v for k, v in document.items()})


@dataclass(frozen=True, init=False)
class Regions:
    """A client's region (``local``) and every region it may reach, by name.

    ``regions`` may hold the local region's own entry (so one document serves every region):
    a client given no connect string of its own connects to it (see
    :meth:`local_region`). :attr:`others` are the regions a service may fail over to.
    ``home``: the region this process is in, whose default identity
    (``$SENTINEL_ZK_IDENTITY``) it holds (default ``local``); it differs from ``local`` only
    for a command acting in another region (``--region``, :meth:`acting_in`).
    """

    local: str
    regions: Mapping[str, Region] = field(default_factory=dict)
    home: str = ""

    def __init__(
        self,
        local: str,
        regions: Iterable[Region] | Mapping[str, Region] = (),
        home: str | None = None,
    ) -> None:
        with _field("local"):
            validate_name("region", local)
        if home is not None:
            with _field("home"):
                validate_name("region", home)
        if isinstance(regions, Mapping):
            regions = regions.values()
        by_name: dict[str, Region] = {}
        for region in regions:
            if not isinstance(region, Region):
                raise RegionConfigError(
                    f"must hold Region values, not {type(region).__name__}", field="regions"
                )
            if region.name in by_name:
                raise RegionConfigError("named twice", field=f"regions.{region.name}")
            by_name[region.name] = region
        if len(by_name) > MAX_REGIONS:
            raise RegionConfigError(
                f"{len(by_name)} regions; at most {MAX_REGIONS}", field="regions"
            )
        if by_name and local not in by_name:
            # A misspelt local region would make the client's own region one it fails over
            # to, and connect it wherever its default connect string points.
            raise RegionConfigError(_unknown(local, by_name), field="local")
        object.__setattr__(self, "local", local)
        object.__setattr__(self, "regions", MappingProxyType(by_name))
        object.__setattr__(self, "home", local if home is None else home)

    def __repr__(self) -> str:
        home = "" if self.home == self.local else f", home={self.home!r}"
        return f"Regions(local={self.local!r}, regions={sorted(self.regions)!r}{home})"

    def __hash__(self) -> int:
        return hash((self.local, tuple(self.regions.values()), self.home))

    def __reduce__(self) -> tuple[Any, ...]:  # plain values travel (Spark closures)
        return Regions, (self.local, tuple(self.regions.values()), self.home)

    def acting_in(self, name: str) -> Regions:
        """These regions as a command acting in region ``name`` sees them (``--region``): it
        connects there and fails over from there, and its home, whose default identity it
        holds, stays this one's (:meth:`identity_of`)."""
        return Regions(name, self.regions, home=self.home)

    @property
    def others(self) -> tuple[Region, ...]:
        """The regions other than the local one, in the order they were given."""
        return tuple(r for name, r in self.regions.items() if name != self.local)

    def local_region(self) -> Region | None:
        """The local region's entry, None when the configuration has none (the client's own
        connection settings then say where the local ensemble is)."""
        return self.regions.get(self.local)

    def identity_of(self, region: Region) -> str | None:
        """The identity a session to ``region`` uses, by the one rule
        (:func:`~sentinel.regions.identity.identity_for`): the region's own; else, for the
        home region, the default (``$SENTINEL_ZK_IDENTITY``), and for another region none:
        one region's password never reaches another region's ensemble unless that region's
        entry names it (``identity_env``)."""
        return identity_for(region.name, region.identity, self.home)

    def region(self, name: str) -> Region:
        """The region called ``name``; RegionConfigError when there is none."""
        try:
            return self.regions[name]
        except KeyError:
            raise RegionConfigError(_unknown(name, self.regions), field="regions") from None

    def check_failover(self, rule: Failover) -> None:
        """RegionConfigError (field ``failover``) when ``rule`` names a region this
        configuration does not hold: its clients would skip it (``not configured``). A
        configuration that holds no region knows none to check against."""
        for name in rule.regions if self.regions else ():
            if name not in self.regions:
                raise RegionConfigError(_unknown(name, self.regions), field="failover")

    @classmethod
    def parse(
        cls,
        document: object,
        local: str | None = None,
        env: Mapping[str, str] | None = None,
        default_local: str | None = None,
    ) -> Regions:
        """The one parser: a decoded regions document (see the module), with ``local``
        (when given) overriding the document's, and ``default_local`` naming it when neither
        does. Raises RegionConfigError naming the field."""
        if not isinstance(document, dict):
            raise RegionConfigError(
                f"must be a JSON object, not {type(document).__name__}", field="regions document"
            )
        unknown = sorted(set(document) - {"local", "regions"})
        if unknown:
            raise RegionConfigError(
                f"unknown field(s) {unknown}; a document has 'local' and 'regions'",
                field="regions document",
            )
        local = local if local is not None else document.get("local", default_local)
        if local is None:
            raise RegionConfigError(
                f"this client's region is not named: set ${REGION_ENV}, --region or 'local'",
                field="local",
            )
        entries = document.get("regions", {})
        if not isinstance(entries, dict):
            raise RegionConfigError(
                f"must be an object of regions by name, not {type(entries).__name__}",
                field="regions",
            )
        regions = []
        for name, entry in entries.items():
            with _field("regions"):
                validate_name("region", name)
            regions.append(Region.from_document(name, entry, env))
        return cls(local, regions)

    @classmethod
    def from_text(
        cls,
        text: str,
        local: str | None = None,
        env: Mapping[str, str] | None = None,
        source: str = "regions",
        default_local: str | None = None,
    ) -> Regions:
        """Parse ``text``: a JSON document when it starts with ``{``, else the path of a file
        holding one (at most :data:`MAX_DOCUMENT_BYTES`). ``source`` says where the text came
        from in errors (``$SENTINEL_REGIONS``, ``--regions``)."""
        if not isinstance(text, str) or not text.strip():
            raise RegionConfigError("empty: give a JSON document or a file's path", field=source)
        if text.lstrip().startswith("{"):
            raw = text.encode()
        else:
            try:
                with Path(text).open("rb") as file:
                    raw = file.read(MAX_DOCUMENT_BYTES + 1)
            except OSError as exc:
                raise RegionConfigError(
                    f"cannot read {text!r}: {exc.strerror or type(exc).__name__}", field=source
                ) from None
        if len(raw) > MAX_DOCUMENT_BYTES:
            raise RegionConfigError(
                f"longer than {MAX_DOCUMENT_BYTES} bytes: not a regions document", field=source
            )
        try:
            document = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise RegionConfigError(f"not JSON ({exc})", field=source) from None
        return cls.parse(document, local, env, default_local)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Regions | None:
        """The regions of ``$SENTINEL_REGIONS`` and ``$SENTINEL_REGION``; None when
        ``$SENTINEL_REGIONS`` is unset (a client of one region). ``$SENTINEL_REGION`` alone
        names the region without others to reach."""
        env = os.environ if env is None else env
        text = env.get(REGIONS_ENV) or None
        local = env.get(REGION_ENV) or None
        if text is None:
            return None if local is None else cls(local)
        return cls.from_text(text, local, env, source=f"${REGIONS_ENV}")

    @classmethod
    def resolve(cls, regions: Regions | bool | None) -> Regions | None:
        """``regions`` as clients accept it: a :class:`Regions`; None or True for
        :meth:`from_env` (None also when the environment names none); False for none."""
        if regions is None or regions is True:
            return cls.from_env()
        if regions is False:
            return None
        if not isinstance(regions, Regions):
            raise RegionConfigError(
                f"must be Regions, True, False or None, not {type(regions).__name__}",
                field="regions",
            )
        return regions
