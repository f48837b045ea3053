"""Checks of settings (constructor arguments), each refusing with a ValidationError that names
the setting, so a wrong value fails where it is given rather than later, on another thread or
as a plain ``ValueError``. Run once, at construction: never on a lookup."""

from __future__ import annotations

import math
import os
from typing import Any, TypeVar

from sentinel.errors import ValidationError

T = TypeVar("T")


def number(
    name: str,
    value: object,
    *,
    above: float | None = None,
    least: float | None = None,
    most: float | None = None,
) -> float:
    """``value`` if it is a finite int or float (not a bool), above ``above``, at least
    ``least`` and at most ``most``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(f"{name} must be a number, not {type(value).__name__}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int past float range
        finite = False
    if not finite:
        raise ValidationError(f"{name} must be a finite number, got {value!r}")
    if above is not None and not value > above:
        raise ValidationError(f"{name} must be above {above:g}, got {value!r}")
    if least is not None and value < least:
        raise ValidationError(f"{name} must be {least:g} or more, got {value!r}")
    if most is not None and value > most:
        raise ValidationError(f"{name} must be {most:g} or less, got {value!r}")
    return value


def integer(name: str, value: object, *, least: int) -> int:
    """``value`` if it is an int (not a bool) of at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{name} must be an integer, not {type(value).__name__}")
    if value < least:
        raise ValidationError(f"{name} must be {least} or more, got {value!r}")
    return value


def flag(name: str, value: object, *, optional: bool = False) -> Any:
    """``value`` if it is True or False (or, ``optional``, None): 1 or "yes" are refused,
    so a misspelt setting is not silently read as true."""
    if isinstance(value, bool) or (optional and value is None):
        return value
    allowed = "True, False or None" if optional else "True or False"
    raise ValidationError(f"{name} must be {allowed}, not {type(value).__name__}")


def instance(name: str, value: object, kind: type[T], *, optional: bool = True) -> T | None:
    """``value`` if it is a ``kind`` (or, ``optional``, None)."""
    if isinstance(value, kind) or (optional and value is None):
        return value
    allowed = kind.__name__ + (" or None" if optional else "")
    raise ValidationError(f"{name} must be {allowed}, not {type(value).__name__}")


def path(name: str, value: object) -> str | os.PathLike[str] | None:
    """``value`` if it is a file path (str or os.PathLike) or None."""
    if value is None or isinstance(value, str | os.PathLike):
        return value
    raise ValidationError(
        f"{name} must be a path (str or os.PathLike) or None, not {type(value).__name__}"
    )
