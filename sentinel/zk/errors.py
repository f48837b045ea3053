"""kazoo's exceptions raised as Sentinel's, so callers catch one hierarchy."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from kazoo.exceptions import (
    AuthFailedError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from sentinel.errors import (
    AccessDenied,
    AuthenticationFailed,
    ConnectionInterrupted,
    RegistryError,
    SentinelError,
)

_P = ParamSpec("_P")
_R = TypeVar("_R")

CONNECTION_ERRORS = (ConnectionLoss, SessionExpiredError, ConnectionClosedError, KazooTimeoutError)


def translate(exc: BaseException, operation: str) -> BaseException:
    """The Sentinel exception for a kazoo one (other exceptions are returned unchanged)."""
    if isinstance(exc, CONNECTION_ERRORS):
        return ConnectionInterrupted(
            f"connection to ZooKeeper lost during {operation} ({type(exc).__name__}); "
            "retry once the client has reconnected"
        )
    if isinstance(exc, NoAuthError):
        return AccessDenied(
            f"ZooKeeper's ACLs refused {operation}: this client's identity may not write there"
        )
    if isinstance(exc, AuthFailedError):
        return AuthenticationFailed(
            f"ZooKeeper refused this client's identity during {operation}: the SASL login "
            "failed (unknown user or wrong password)"
        )
    if isinstance(exc, KazooException) and not isinstance(exc, SentinelError):
        return RegistryError(f"ZooKeeper refused {operation}: {type(exc).__name__} {exc}")
    return exc


def translate_zk_errors(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Decorate a method so that kazoo's exceptions leave it as Sentinel's."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except KazooException as exc:
            raise translate(exc, f"{method.__name__}()") from exc
        except KazooTimeoutError as exc:
            raise translate(exc, f"{method.__name__}()") from exc

    return wrapper
