"""A service's failover rule: where its lookups go when the local region has no eligible
instance, like one of Consul's prepared queries, but resolved by the client.

The rule lives in the service's spec (``/services/<service>``, field ``failover``), so every
client of the service agrees, and a lookup may override it (``get_service(...,
failover=...)``). It is a plain value: the regions to try in order, or the nearest N by the
round-trip time the client measures, or both (the nearest first, then the listed ones, as
Consul's ``NearestN`` then ``Datacenters``); optionally another service's name to ask for
there; whether the client follows the service in those regions before it needs them (warm) or
on its first failover (cold); and how long the local region must have been eligible again
before lookups return to it (``return_after``, the hold-down that keeps a client from
flapping). :data:`LOCAL_ONLY` (no region) is the default of a service without a rule.

Text form, for the CLI and the environment (:meth:`Failover.parse`): ``local``,
``west,north`` (an ordered list), ``nearest:2``, ``nearest:2,west``, with options after
``;``: ``nearest:2;service=orders-ro;warm;return_after=5``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sentinel.errors import ValidationError
from sentinel.registry.layout import validate_name

#: Seconds the local region must have had an eligible instance again, without a gap, before a
#: client that failed over returns to it (docs/decisions/failover-returns-home-after-a-hold.md).
DEFAULT_RETURN_AFTER = 10.0
#: Bounds of a rule read from ZooKeeper or given by a caller: regions named, and the hold-down.
MAX_REGIONS = 64
MAX_RETURN_AFTER = 3600.0


@dataclass(frozen=True)
class Failover:
    """Where lookups of a service go when the local region has no eligible instance.

    Attributes
    ----------
    regions : tuple of str, default ()
        Regions to try, in order (after the ``nearest`` ones).
    nearest : int, default 0
        Try first this many regions, nearest first by the round-trip time the client measures
        to each region's ensemble (0: none by distance).
    service : str or None, default None (the same name)
        The service to ask for in the other region (a read-only twin, say).
    warm : bool, default False
        Follow the service in those regions as soon as it is loaded here (a session and
        watches there, and a failover that costs a lookup), instead of on its first failover
        (cold: nothing is opened or read remotely until needed, and the first failover pays a
        connection and a load). The default is measured in ``docs/benchmarks.md``.
    return_after : float, default 10.0
        Seconds the local region must have had an eligible instance again before lookups
        return to it; a local instance that comes and goes faster never draws clients back.
    """

    regions: tuple[str, ...] = ()
    nearest: int = 0
    service: str | None = None
    warm: bool = False
    return_after: float = DEFAULT_RETURN_AFTER

    def __post_init__(self) -> None:
        regions = self.regions
        if isinstance(regions, str) or not isinstance(regions, tuple | list):
            raise ValidationError(
                f"failover regions must be a tuple of region names, not {type(regions).__name__}"
            )
        if len(regions) > MAX_REGIONS:
            raise ValidationError(f"failover names {len(regions)} regions; at most {MAX_REGIONS}")
        for region in regions:
            validate_name("failover region", region)
        if len(set(regions)) != len(regions):
            raise ValidationError(f"failover regions {list(regions)} name a region twice")
        object.__setattr__(self, "regions", tuple(regions))
        if isinstance(self.nearest, bool) or not isinstance(self.nearest, int):
            raise ValidationError(f"failover nearest must be an integer, not {self.nearest!r}")
        if not 0 <= self.nearest <= MAX_REGIONS:
            raise ValidationError(f"failover nearest must be 0-{MAX_REGIONS}, got {self.nearest}")
        if self.service is not None:
            validate_name("failover service", self.service)
        if not isinstance(self.warm, bool):
            raise ValidationError("failover warm must be true or false")
        after = self.return_after
        if (
            isinstance(after, bool)
            or not isinstance(after, int | float)
            or not math.isfinite(after)
            or not 0 <= after <= MAX_RETURN_AFTER
        ):
            raise ValidationError(
                f"failover return_after must be 0-{MAX_RETURN_AFTER:g} seconds, got {after!r}"
            )

    @property
    def local_only(self) -> bool:
        """Whether the rule names no other region: lookups never leave the local one."""
        return not self.regions and not self.nearest

    def describe(self) -> str:
        """The rule in words, for ``explain()`` and errors."""
        if self.local_only:
            return "local only"
        parts = ([f"nearest {self.nearest} by round-trip time"] if self.nearest else []) + (
            [f"then {', '.join(self.regions)}"] if self.regions else []
        )
        text = " ".join(parts).removeprefix("then ")
        return text + (f" as {self.service!r}" if self.service else "")

    def to_document(self) -> dict[str, Any]:
        """The spec's ``failover`` field (defaults left out)."""
        document: dict[str, Any] = {}
        if self.regions:
            document["regions"] = list(self.regions)
        if self.nearest:
            document["nearest"] = self.nearest
        if self.service is not None:
            document["service"] = self.service
        if self.warm:
            document["warm"] = True
        if self.return_after != DEFAULT_RETURN_AFTER:
            document["return_after"] = self.return_after
        return document

    @classmethod
    def from_document(cls, document: object) -> Failover | None:
        """The rule of a spec's ``failover`` field (None when absent); ValidationError for one
        that is not a rule (the spec's decoder turns it into a DecodeError)."""
        if document is None:
            return None
        if not isinstance(document, dict):
            raise ValidationError(f"failover must be an object, not {type(document).__name__}")
        unknown = set(document) - {"regions", "nearest", "service", "warm", "return_after"}
        if unknown:
            raise ValidationError(f"failover has unknown field(s) {sorted(unknown)}")
        regions = document.get("regions", [])
        if not isinstance(regions, list):
            raise ValidationError("failover regions must be a list")
        return cls(
            regions=tuple(regions),
            nearest=document.get("nearest", 0),
            service=document.get("service"),
            warm=document.get("warm", False),
            return_after=document.get("return_after", DEFAULT_RETURN_AFTER),
        )

    @classmethod
    def parse(cls, text: str) -> Failover:
        """A rule from its text form (see the module): ``local``, ``west,north``,
        ``nearest:2,west;service=orders-ro;warm;return_after=5``."""
        if not isinstance(text, str) or not text.strip():
            raise ValidationError("failover must be 'local', regions, or 'nearest:N'")
        where, *options = (part.strip() for part in text.split(";"))
        fields: dict[str, Any] = {}
        regions = []
        for item in () if where == "local" else (p.strip() for p in where.split(",")):
            if item.startswith("nearest:"):
                count = item.removeprefix("nearest:")
                if not count.isdigit():
                    raise ValidationError(f"failover {item!r}: nearest:N takes a number")
                fields["nearest"] = int(count)
            else:
                regions.append(item)
        for option in options:
            name, _, value = option.partition("=")
            if name == "warm" and not value:
                fields["warm"] = True
            elif name == "cold" and not value:
                fields["warm"] = False
            elif name == "service" and value:
                fields["service"] = value
            elif name == "return_after" and value:
                try:
                    fields["return_after"] = float(value)
                except ValueError:
                    raise ValidationError(
                        f"failover return_after={value!r} is not a number"
                    ) from None
            else:
                raise ValidationError(
                    f"failover option {option!r} is not one of warm, cold, service=NAME, "
                    "return_after=SECONDS"
                )
        return cls(regions=tuple(regions), **fields)


LOCAL_ONLY = Failover()
"""The rule of a service without one: lookups stay in the local region."""

__all__ = ["Failover"]
