"""The authentication manager's writer API: publish and rotate credentials, bound to a client.

A client exposes it as ``client.credentials``, apart from lookups and publishing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kazoo.client import KazooClient

from sentinel.auth.keys import ManagerKey
from sentinel.auth.manager import CredentialBackend, Rotation, RotationResult, update_auth
from sentinel.errors import CalledFromListener
from sentinel.zk.errors import translate_zk_errors


class CredentialWriter:
    """Publishes and rotates per-client credentials through one client's session.

    ``session`` returns the client's current kazoo client, ``writable`` runs before every
    write, and ``on_listener_thread`` says whether the caller is the thread that runs the
    client's listeners (where a rotation, which waits for that client's own confirmation,
    would never end).
    """

    def __init__(
        self,
        namespace: str,
        session: Callable[[], KazooClient],
        writable: Callable[[], None],
        on_listener_thread: Callable[[], bool],
    ) -> None:
        self._namespace = namespace
        self._session = session
        self._writable = writable
        self._on_listener_thread = on_listener_thread

    @translate_zk_errors
    def publish(
        self,
        service: str,
        client: str,
        credential: Mapping[str, Any],
        *,
        signer: ManagerKey | None = None,
    ) -> int:
        """Publish ``credential`` (``{"user": ..., "password": ...}``) for a client of a service.

        It is encrypted to the client's newest published public key (HPKE) and replaces the
        credentials published before; returns its version, one above every version published
        or confirmed by the client. ``signer`` signs it for clients that trust only the
        manager's key. Raises :class:`~sentinel.errors.ClientKeyNotFound` when the client has
        published no key, :class:`~sentinel.errors.ValidationError` for a malformed
        credential, :class:`~sentinel.errors.SigningRequired` without ``signer`` in a secured
        namespace, in each case before anything is written.
        """
        self._writable()
        return update_auth(
            self._session(), self._namespace, service, client, credential, signer=signer
        )

    @translate_zk_errors
    def rotate(
        self,
        service: str,
        clients: str | list[str] | tuple[str, ...],
        backend: CredentialBackend,
        *,
        timeout: float = 30.0,
        signer: ManagerKey | None = None,
    ) -> RotationResult:
        """Rotate the credentials of ``clients`` of ``service`` by Procedure 2.

        The backend creates each new credential, it is published alongside the old one, and
        the old one is revoked only once every live client has confirmed the new version
        (see :mod:`sentinel.auth.manager`). Raises :class:`~sentinel.errors.RotationFailed`
        naming the step (and, on a timeout, the clients that had not confirmed); the old
        credential then still works. Without ``signer`` in a secured namespace it raises
        :class:`~sentinel.errors.SigningRequired` before the backend creates anything.
        From a listener it raises :class:`~sentinel.errors.CalledFromListener`: the rotation
        waits for confirmations, this client's own made by the thread that runs listeners.
        """
        self._writable()
        if self._on_listener_thread():
            raise CalledFromListener(
                "credentials.rotate() waits for clients to confirm the new credential, and "
                "this client confirms on the thread that runs its listeners: call it from "
                "another thread"
            )
        names = [clients] if isinstance(clients, str) else list(clients)
        rotation = Rotation(
            self._session(), self._namespace, service, names, backend, signer=signer
        )
        return rotation.run(timeout)
