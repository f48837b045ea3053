"""Old names kept for one release: each warns with :class:`DeprecationWarning` and calls the
new one (or, for a setting now grouped in a value object, sets it there), so code written
against the previous release runs unchanged meanwhile."""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any, TypeVar

# The settings' value objects (CacheConfig, AuthConfig): taken as given, never imported, so
# that this module stands on the lowest floor and any module may warn through it.
Cache = TypeVar("Cache")
Auth = TypeVar("Auth")


def warn(old: str, new: str, *, kind: str = "name", stacklevel: int = 3) -> None:
    """Warn that ``old`` (a call or a keyword as written: ``Sentinel.drain()``,
    ``Sentinel(auth_keys=...)``) is deprecated, for ``new``; ``kind`` names what goes (a
    ``name`` or a ``keyword``); ``stacklevel`` 3 points at the caller of the function that
    warns."""
    warnings.warn(
        f"{old} is deprecated: use {new} (the old {kind} goes in the next release)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def moved(old: str, new: str) -> Callable[..., Any]:
    """A method named ``old`` that warns and calls ``self.<new>`` (a dotted path: a role
    object's method, ``shard_maps.create``), with the same arguments."""
    target = operator.attrgetter(new)

    def alias(self: Any, *args: Any, **kwargs: Any) -> Any:
        warn(f"{type(self).__name__}.{old}()", f".{new}()")
        return target(self)(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old
    alias.__doc__ = f"Deprecated: use ``{new}``, which takes the same arguments."
    return alias


class OldMethodNames:
    """The clients' methods under their names of the previous release, each a :func:`moved`
    alias: one table for :class:`~sentinel.client.Sentinel` and
    :class:`~sentinel.aio.AsyncSentinel`, which both inherit it."""

    # One word per concept now (docs/decisions/one-word-per-concept.md).
    register_service = moved("register_service", "register")
    deregister_service = moved("deregister_service", "deregister")
    get_services = moved("get_services", "eligible_instances")
    instances = moved("instances", "cached_instances")
    # Methods of the role objects now.
    create_shard_policy = moved("create_shard_policy", "shard_maps.create")
    ensure_shard_policy = moved("ensure_shard_policy", "shard_maps.ensure")
    update_shard_info = moved("update_shard_info", "shard_maps.assign")
    remove_shard_key = moved("remove_shard_key", "shard_maps.unassign")
    update_shard_info_many = moved("update_shard_info_many", "shard_maps.assign_many")
    request_placement = moved("request_placement", "shard_maps.request_placement")
    update_auth = moved("update_auth", "credentials.publish")
    rotate_auth = moved("rotate_auth", "credentials.rotate")


# The settings that were keywords of Sentinel() of their own before CacheConfig and AuthConfig
# grouped them: every field of CacheConfig but those new with the value object, and these.
_NEW_WITH_CACHE_CONFIG = ("curator_base_paths", "events_on_connection_thread")
_UNGROUPED_AUTH = {
    "auth_keys": "keys",
    "auth_client": "client",
    "auth_signer": "signer",
    "require_signed": "require_signed",
}


def settings_given_ungrouped(given: dict[str, Any], cache: Cache, auth: Auth) -> tuple[Cache, Auth]:
    """``cache`` (a ``CacheConfig``) and ``auth`` (an ``AuthConfig``) with the settings
    ``given`` as the old keywords folded in, each with a :class:`DeprecationWarning`; a keyword
    no release took is a :class:`TypeError`, as for any function. The value objects check the
    values."""
    ungrouped = {
        **{
            f.name: ("cache", f.name)
            for f in fields(cache)  # type: ignore[arg-type]
            if f.name not in _NEW_WITH_CACHE_CONFIG
        },
        **{old: ("auth", new) for old, new in _UNGROUPED_AUTH.items()},
    }
    unknown = sorted(given.keys() - ungrouped.keys())
    if unknown:
        raise TypeError(f"Sentinel() got an unexpected keyword argument {unknown[0]!r}")
    folded: dict[str, dict[str, Any]] = {"cache": {}, "auth": {}}
    for name, value in given.items():
        group, field = ungrouped[name]
        folded[group][field] = value
        value_object = "CacheConfig" if group == "cache" else "AuthConfig"
        warn(
            f"Sentinel({name}=...)",
            f"{group}={value_object}({field}=...)",
            kind="keyword",
            stacklevel=4,
        )
    return replace(cache, **folded["cache"]), replace(auth, **folded["auth"])  # type: ignore[type-var]
