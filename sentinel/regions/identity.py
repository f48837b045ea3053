"""Which password goes to which ensemble: the one rule, for every session to a region.

A process holds passwords of several regions at most: its own region's default
(``$SENTINEL_ZK_IDENTITY``, or its region's entry), and another region's when that region's
entry names one (``Region(identity=...)``, ``identity_env``). Every session Sentinel opens to
an ensemble of a region asks :func:`identity_for` what to present there, whoever opens it:
a client (its own session, its failover sessions, an agent-fed client reading another region
through the agent), the CLI (``--region``, ``--region all``, the shard manager's copies) and
the agent (its own session and its session to each other region). docs/regions.md,
"Identities", says the same rule for users.

Why the default identity goes to the home region only: it is that ensemble's password, and
sending it to every ensemble a process reaches (across a WAN, maybe in the clear) would hand
it to whoever runs or listens to them.
"""

from __future__ import annotations

from sentinel.auth.acl import ANONYMOUS


def identity_for(region: str | None, own: str | None, home: str | None) -> str | None:
    """The identity a session to ``region``'s ensemble presents.

    ``region``: the region the session goes to (None: the one ensemble of a process that
    names no region). ``own``: the identity given for that region itself (its entry's
    ``identity``, through ``identity_env``, or ``identity=`` given in code for that session).
    ``home``: the region this process is in (``$SENTINEL_REGION``, else the regions
    document's ``local``; None: not named).

    The answer: ``own`` when there is one; else, for the home region (or the one ensemble of
    a process that names no region), None: the default identity (``$SENTINEL_ZK_IDENTITY``,
    :func:`~sentinel.auth.acl.effective_identity`); else, for any other region,
    :data:`~sentinel.auth.acl.ANONYMOUS`: nothing, whatever the environment holds.
    """
    if own is not None:
        return own
    if region is None or region == home:
        return None
    return ANONYMOUS
