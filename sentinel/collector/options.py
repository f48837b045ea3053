"""Reading one table of a collector's configuration, with errors that say where and what.

Every getter names the key it reads, so :meth:`Options.finish` can reject the keys nobody read
(a misspelt option is an error, not a silent default).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sentinel.errors import ValidationError

_REQUIRED: Any = object()
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\Z")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class Options:
    """The keys of one table, read by type; ``where`` prefixes every error message."""

    def __init__(self, table: object, where: str) -> None:
        if not isinstance(table, Mapping):
            raise ValidationError(f"{where}: expected a table, got {type(table).__name__}")
        self.table = table
        self.where = where
        self._read: set[str] = set()

    def error(self, key: str, problem: str) -> ValidationError:
        """An error about ``key`` of this table."""
        return ValidationError(f"{self.where}.{key}: {problem}")

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        """The raw value of ``key``; a missing required key is an error."""
        self._read.add(key)
        if key in self.table:
            return self.table[key]
        if default is _REQUIRED:
            raise ValidationError(f"{self.where}: missing required field {key!r}")
        return default

    def string(self, key: str, default: Any = _REQUIRED) -> Any:
        """A non-empty string."""
        value = self.get(key, default)
        if value is not default and (not isinstance(value, str) or not value):
            raise self.error(key, f"expected a non-empty string, got {value!r}")
        return value

    def number(self, key: str, default: Any = _REQUIRED, *, minimum: float = 0.0) -> Any:
        """A number at least ``minimum``."""
        value = self.get(key, default)
        if value is default:
            return value
        if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
            raise self.error(key, f"expected a number >= {minimum:g}, got {value!r}")
        return value

    def duration(self, key: str, default: Any = _REQUIRED, *, positive: bool = True) -> Any:
        """Seconds: a number, or a string such as ``"500ms"``, ``"5s"``, ``"2m"``."""
        value = self.get(key, default)
        if value is default:
            return value
        seconds = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        elif isinstance(value, str) and (match := _DURATION.match(value.strip())):
            seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        if seconds is None or seconds < 0 or (positive and seconds == 0):
            raise self.error(
                key,
                f"{value!r} is not a {'positive ' if positive else ''}duration "
                "(seconds, or a string such as '500ms', '5s', '2m')",
            )
        return seconds

    def strings(self, key: str, default: Any = _REQUIRED) -> Any:
        """A non-empty list of non-empty strings."""
        value = self.get(key, default)
        if value is default:
            return value
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, str) and v for v in value)
        ):
            raise self.error(key, f"expected a non-empty list of strings, got {value!r}")
        return tuple(value)

    def table_of(self, key: str, default: Any = _REQUIRED) -> Any:
        """A nested table, as :class:`Options`."""
        value = self.get(key, default)
        return value if value is default else Options(value, f"{self.where}.{key}")

    def finish(self) -> None:
        """Reject the keys that no getter read."""
        unknown = sorted(set(self.table) - self._read)
        if unknown:
            raise ValidationError(
                f"{self.where}: unknown field(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(sorted(self._read))}"
            )
