"""Keep secrets out of kazoo's log records, at every level.

At DEBUG kazoo logs each request it sends, the digest authentication included
(``Auth(type=0, scheme='digest', auth='publisher:<password>')``), the session password of a
reconnection (``Connect(..., passwd=b'...')``) and, with SASL, the tokens; at its BLATHER level
the session password again. ``sentinel -vv`` turns DEBUG on. A
:class:`KazooSecretFilter` on kazoo's loggers rewrites each record's message (after formatting
its arguments) before any handler sees it: ``user:password`` becomes ``user:***``, SASL tokens
and session passwords become ``***``.

Logger filters only see records logged on their own logger, so the filter is put on every
``kazoo`` logger that exists; :func:`install_kazoo_redaction` is idempotent and runs whenever a
connection's arguments are built (:func:`sentinel.connection.client_arguments`, which every
Sentinel ``KazooClient`` is made from), after kazoo's modules are imported and before the
client sends its credentials.
"""

from __future__ import annotations

import logging
import re

REDACTED = "***"

# auth='user:password' (or "...", or b'...'): keep the user, hide what follows the colon.
_AUTH = re.compile(
    r"""(?P<head>\bauth=b?(?P<q>['"])[^:'"\\]*:)(?:\\.|(?!(?P=q)).)*(?P=q)""", re.DOTALL
)
# SASL(challenge=b'...') of SASL requests and replies, and Connect(..., passwd=b'...'), the
# session password any client could join the session with.
_TOKEN = re.compile(
    r"""(?P<head>\b(?:challenge|token|passwd)=)b?(?P<q>['"])(?:\\.|(?!(?P=q)).)*(?P=q)"""
)
# kazoo's BLATHER lines "session_passwd: <hex>".
_SESSION_PASSWORD = re.compile(r"(?P<head>\bsession_passwd: )\S+")


def redact(text: str) -> str:
    """``text`` with digest passwords, SASL tokens and session passwords replaced by ``***``."""
    text = _AUTH.sub(lambda m: f"{m['head']}{REDACTED}{m['q']}", text)
    text = _TOKEN.sub(lambda m: f"{m['head']}{REDACTED}", text)
    return _SESSION_PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}", text)


class KazooSecretFilter(logging.Filter):
    """Rewrites a record's formatted message with :func:`redact`; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not format: leave it to logging
            return True
        redacted = redact(message)
        if redacted != message or record.args:
            record.msg, record.args = redacted, None
        return True


_FILTER = KazooSecretFilter()


def install_kazoo_redaction() -> None:
    """Put the filter on ``kazoo`` and every ``kazoo.*`` logger that exists (idempotent)."""
    existing = list(logging.Logger.manager.loggerDict)
    for name in ["kazoo", *(name for name in existing if name.startswith("kazoo."))]:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
