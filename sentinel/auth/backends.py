"""Credential backends: where a rotation creates and revokes credentials.

A backend is any object with ``create(service, client, version) -> mapping`` and
``revoke(service, client, version)`` (:class:`~sentinel.auth.manager.CredentialBackend`).
Two ship here: :class:`FileBackend` keeps generated passwords in a file (for tests and for
services that read their accepted credentials from a file), and :class:`PostgresBackend`
creates one PostgreSQL login role per (client, version), the way dynamic-secret systems do.
Third-party backends register under the ``sentinel.auth_backends`` entry point.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sentinel.errors import AuthError
from sentinel.private_files import read_private, write_secret_file

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
            document = json.loads(read_private(self.path, "credential file", AuthError))
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
ROLE_NAME_MAX_BYTES = 63  # PostgreSQL's identifier limit (NAMEDATALEN - 1)
ROLE_HASH_CHARS = 16  # 64 bits: no accidental collision, none worth searching for
# The shape of a role name with the hash: a name of the old scheme with this shape might be
# another (service, client)'s current role, so revoking never drops it as a legacy name.
_HASHED_ROLE = re.compile(rf"_[0-9a-f]{{{ROLE_HASH_CHARS}}}_v[0-9]+\Z")


def _readable(service: str, client: str) -> str:
    """``<client>_<service>`` lower-case, ``_`` for every other character: not unique."""
    return _ROLE_UNSAFE.sub("_", f"{client}_{service}".lower())


class PostgresBackend:
    """One PostgreSQL login role per (client, version), named by :meth:`role_name`.

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
        """The role of one version: ``<client>_<service>_<hash>_v<version>``, at most 63 bytes.

        The readable part is lower-case with ``_`` for other characters, cut short when the
        name would be too long; ``<hash>`` (16 hex digits of SHA-256 of the exact service and
        client) keeps pairs apart that read the same, such as (``c``, ``a-b``) and
        (``b-c``, ``a``). Deterministic: revoking finds the role that creating made.
        """
        exact = json.dumps([service, client], ensure_ascii=False).encode("utf-8")
        digest = hashlib.sha256(exact).hexdigest()[:ROLE_HASH_CHARS]
        suffix = f"_{digest}_v{version}"
        return _readable(service, client)[: max(0, ROLE_NAME_MAX_BYTES - len(suffix))] + suffix

    @staticmethod
    def legacy_role_name(service: str, client: str, version: int) -> str:
        """The name versions created before the hash was added have: ``<client>_<service>_v<n>``
        (several pairs can share it). Revoking drops that role too, if it exists."""
        suffix = f"_v{version}"
        return _readable(service, client)[: ROLE_NAME_MAX_BYTES - len(suffix)] + suffix

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
        """End the role's sessions and drop it, and the same for a role of the version under
        its :meth:`legacy_role_name` (created before an upgrade), unless that name has the
        shape of a current one."""
        roles = [self.role_name(service, client, version)]
        legacy = self.legacy_role_name(service, client, version)
        if not _HASHED_ROLE.search(legacy):
            roles.append(legacy)
        self._execute(*(statement for role in roles for statement in _drop_role(role)))


def _drop_role(role: str) -> list[Any]:
    """The statements that disable ``role``, end its sessions and drop it (if it exists)."""
    from psycopg import sql

    return [
        sql.SQL(
            "DO $$BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = {name}) "
            "THEN ALTER ROLE {role} NOLOGIN; END IF; END$$"
        ).format(name=sql.Literal(role), role=sql.Identifier(role)),
        sql.SQL("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = {}").format(
            sql.Literal(role)
        ),
        sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)),
    ]


__all__ = ["FileBackend", "PostgresBackend"]
