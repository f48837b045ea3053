"""``sentinel ui``: a read-only web dashboard of the registry, from one client's cache.

One room per concern: :mod:`~sentinel.ui.source` (what the pages read: the client's cache,
kept following every service, and the CLI's readers for the rest), :mod:`~sentinel.ui.views`
(pure functions from what was read to what a page shows), :mod:`~sentinel.ui.live` (one
subscription to the cache's changes, fanned out to every open stream),
:mod:`~sentinel.ui.security` (headers, Host, same-origin and CSRF checks),
:mod:`~sentinel.ui.app` (the routes) and :mod:`~sentinel.ui.server` (uvicorn, in the
foreground or beside the agent). Needs the ``ui`` extra (Starlette, uvicorn, Jinja2).
"""
