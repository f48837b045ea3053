"""What keeps the dashboard to its own origin: headers, the Host check, CSRF tokens.

- Every response carries a Content-Security-Policy that allows this origin only (no inline
  script or style, no frame), ``X-Content-Type-Options: nosniff``, ``Referrer-Policy:
  same-origin`` and ``Cache-Control: no-store``.
- A request whose ``Host`` is not the address the dashboard is bound to (or a name given with
  ``--allow-host``) is refused with 400: a page on another site cannot reach it by making its
  own name resolve to this address (DNS rebinding).
- An action (a POST) must come from a page of this origin (``Origin``, else
  ``Sec-Fetch-Site: same-origin``; a request with neither is refused) and carry the token of
  the viewer's session: an HMAC of the session cookie (``HttpOnly``, ``SameSite=Strict``)
  under a key the process draws at start and never shows.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Iterable, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

SESSION_COOKIE = "sentinel_ui_session"

HEADERS: Mapping[str, str] = {
    "content-security-policy": "default-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'; object-src 'none'",
    "x-content-type-options": "nosniff",
    # same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with a
    # form's POST, and the same-origin check would refuse the dashboard's own drain buttons
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}


def allowed_hosts(address: str, port: int, names: Iterable[str] = ()) -> frozenset[str]:
    """The ``Host`` values a browser sends to ``address:port``: the address (bracketed when
    IPv6), ``localhost`` too when it is a loopback address, and each of ``names``."""
    ip = ipaddress.ip_address(address)
    hosts = {f"[{address}]" if ip.version == 6 else address, *names}
    if ip.is_loopback:
        hosts.add("localhost")
    return frozenset(f"{host}:{port}".lower() for host in hosts)


class Guard:
    """ASGI middleware: the Host check and the headers of every response."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None) -> None:
        self.app = app
        self.hosts = hosts  # None: not checked (an app tested without a server)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host")
        if self.hosts is not None and (host or "").lower() not in self.hosts:
            await _plain(send, 400, "unknown Host: this dashboard answers to its own address")
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def _plain(send: Send, status: int, text: str) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    headers += [(k.encode(), v.encode()) for k, v in HEADERS.items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Tokens:
    """Session cookies and the CSRF token of each (under a key of this process's)."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    @staticmethod
    def new_session() -> str:
        """A session cookie's value."""
        return secrets.token_urlsafe(32)

    def token(self, session: str) -> str:
        """The CSRF token of ``session``."""
        return hmac.new(self._key, session.encode(), hashlib.sha256).hexdigest()

    def valid(self, session: str | None, token: str | None) -> bool:
        """Whether ``token`` is ``session``'s (compared in constant time)."""
        if not session or not token:
            return False
        return hmac.compare_digest(self.token(session), token)


def same_origin(headers: Mapping[str, str], origin: str) -> bool:
    """Whether a request comes from a page of ``origin`` (``http://host:port``): its
    ``Origin`` says so, or without one its ``Sec-Fetch-Site``; neither is a refusal."""
    sent = headers.get("origin")
    if sent is not None:
        return sent.lower() == origin.lower()
    return headers.get("sec-fetch-site") == "same-origin"
