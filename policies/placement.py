"""Policies over where an instance is and what it declares about itself."""

from __future__ import annotations

from typing import Any

from sentinel.strategies import Endpoints, SelectionPolicy


class ZoneAffinity(SelectionPolicy):
    """Instances in ``zone``; with ``fallback`` (default), every instance when none is."""

    pure = True

    def __init__(self, zone: str, fallback: bool = True) -> None:
        self.zone = zone
        self.fallback = fallback

    def select(self, endpoints: Endpoints) -> Endpoints:
        """The endpoints in the zone, or all of them as a fallback."""
        local = tuple(e for e in endpoints if e.zone == self.zone)
        return local if local or not self.fallback else tuple(endpoints)


class Tagged(SelectionPolicy):
    """Instances whose properties include every given ``name=value``."""

    pure = True

    def __init__(self, **properties: Any) -> None:
        self.properties = properties

    def select(self, endpoints: Endpoints) -> Endpoints:
        """The endpoints that carry all the properties."""
        wanted = self.properties.items()
        missing = object()
        return tuple(
            e for e in endpoints if all(e.properties.get(k, missing) == v for k, v in wanted)
        )
