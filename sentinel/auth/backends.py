"""Credential backends: where a rotation creates and revokes credentials.

A backend is any object with ``create(service, client, version) -> mapping`` and
``revoke(service, client, version)`` (:class:`~sentinel.auth.manager.CredentialBackend`).
Two ship here: :class:`FileBackend` keeps generated passwords in a file (for tests and for
services that read their accepted credentials from a file), and :class:`PostgresBackend`
creates one PostgreSQL login role per (client, version), the way dynamic-secret systems do.
Third-party backends register under the ``sentinel.auth_backends`` entry point.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sentinel.auth.keys import write_secret_file
from sentinel.errors import AuthError

PASSWORD_BYTES = 24


def new_password() -> str:
    """A random password of 32 URL-safe characters."""
    return secrets.token_urlsafe(PASSWORD_BYTES)


class FileBackend:
    """Credentials in a JSON file (mode 0600): ``{"<service>/<client>": {"<version>": {...}}}``.

    :meth:`accepts` answers what a service reading this file would: is this credential valid?
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"FileBackend({str(self.path)!r})"

    def _load(self) -> dict[str, dict[str, dict[str, Any]]]:
        try:
            document = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise AuthError(
                f"credential file {str(self.path)!r} is unreadable: {type(exc).__name__}"
            ) from None
        return document if isinstance(document, dict) else {}

    def create(self, service: str, client: str, version: int) -> Mapping[str, Any]:
        """A new user/password pair for ``version`` (the same one if it exists already)."""
        with self._lock:
            document = self._load()
            versions = document.setdefault(f"{service}/{client}", {})
            credential = versions.setdefault(
                str(version), {"user": f"{client}_v{version}", "password": new_password()}
            )
            write_secret_file(self.path, document)
        return dict(credential)

    def revoke(self, service: str, client: str, version: int) -> None:
        """Forget ``version``; it is no longer accepted."""
        with self._lock:
            document = self._load()
            document.get(f"{service}/{client}", {}).pop(str(version), None)
            write_secret_file(self.path, document)

    def accepts(self, service: str, client: str, credential: Mapping[str, Any]) -> bool:
        """Whether ``credential`` is currently valid for (service, client)."""
        versions = self._load().get(f"{service}/{client}", {})
        return any(dict(credential) == stored for stored in versions.values())


_ROLE_UNSAFE = re.compile(r"[^a-z0-9_]")


class PostgresBackend:
    """One PostgreSQL login role per (client, version): ``<client>_<service>_v<version>``.

    ``dsn`` connects as a role allowed to create roles (``CREATEROLE``). ``member_of`` names a
    group role whose privileges every generated role inherits, so grants are made once. Revoking
    terminates the role's sessions and drops it: the old password stops working at once.
    The returned credential holds ``user``, ``password`` and, if given, ``dbname``.
    """

    def __init__(self, dsn: str, *, member_of: str | None = None, dbname: str | None = None):
        self._dsn = dsn
        self.member_of = member_of
        self.dbname = dbname

    def __repr__(self) -> str:
        # The DSN may hold the admin password: never shown.
        return f"PostgresBackend(member_of={self.member_of!r}, dbname={self.dbname!r})"

    @staticmethod
    def role_name(service: str, client: str, version: int) -> str:
        """The role of one version: lower-case, at most 63 bytes (PostgreSQL's limit)."""
        suffix = f"_v{version}"
        base = _ROLE_UNSAFE.sub("_", f"{client}_{service}".lower())
        return base[: 63 - len(suffix)] + suffix

    def _execute(self, *statements: Any) -> None:
        import psycopg  # an optional dependency: the 'postgres' extra

        with psycopg.connect(self._dsn, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def create(self, service: str, client: str, version: int) -> Mapping[str, Any]:
        """Create (or reset the password of) the version's login role."""
        from psycopg import sql

        role = self.role_name(service, client, version)
        password = new_password()
        statements = [
            sql.SQL(
                "DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {name}) "
                "THEN CREATE ROLE {role} LOGIN; END IF; END$$"
            ).format(name=sql.Literal(role), role=sql.Identifier(role)),
            # A literal, not a parameter: utility statements take none. Not logged by default.
            sql.SQL("ALTER ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(password)
            ),
        ]
        if self.member_of:
            statements.append(
                sql.SQL("GRANT {} TO {}").format(
                    sql.Identifier(self.member_of), sql.Identifier(role)
                )
            )
        self._execute(*statements)
        credential = {"user": role, "password": password}
        return credential | ({"dbname": self.dbname} if self.dbname else {})

    def revoke(self, service: str, client: str, version: int) -> None:
        """End the role's sessions and drop it."""
        from psycopg import sql

        role = self.role_name(service, client, version)
        self._execute(
            sql.SQL(
                "DO $$BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = {name}) "
                "THEN ALTER ROLE {role} NOLOGIN; END IF; END$$"
            ).format(name=sql.Literal(role), role=sql.Identifier(role)),
            sql.SQL(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = {}"
            ).format(sql.Literal(role)),
            sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)),
        )
