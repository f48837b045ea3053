"""Files only their owner may read: key rings, signing keys, identities, credential files and the
last-known-good snapshot.

Writing: :func:`write_private` creates a temporary file next to the target with
:func:`tempfile.mkstemp` (a random name opened ``O_CREAT | O_EXCL``, mode 0600 from its first
byte, so neither a file nor a symlink planted at a predictable name is ever written through),
writes, flushes and fsyncs it, and renames it over the target with :func:`os.replace` (which
replaces a symlink at the target rather than following it). A reader sees the old file or the
new one, never half of one; a failed write leaves no temporary file behind.

Reading: :func:`read_private` opens the file and checks the opened file itself (``fstat``, so
a rename in between cannot swap it): it must be a regular file owned by the current user and
neither readable nor writable by group or others, or the caller's typed error says which check
failed and how to fix it. A symlink is followed, and the file it leads to is what is checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sentinel.errors import KeyFileError, SentinelError


def write_private(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` atomically with ``data``, readable and writable by its owner only."""
    path = Path(path)
    directory = path.parent
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    # Make the rename itself durable; a file system that cannot fsync a directory still renamed.
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def private_file_problem(status: os.stat_result) -> str | None:
    """Why a file with ``status`` may not hold secrets, or None if it may."""
    if not stat.S_ISREG(status.st_mode):
        return "is not a regular file"
    if status.st_uid != os.geteuid():
        return f"is owned by uid {status.st_uid}, not by this user (uid {os.geteuid()})"
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o077:
        return f"has mode {mode:04o}: group or others may read or write it (chmod 600 it)"
    return None


def read_private(path: str | os.PathLike[str], what: str, error: type[SentinelError]) -> bytes:
    """The bytes of ``path`` once it is checked to be private (see the module's docstring).

    Raises ``error`` naming ``what`` and the path when a check fails; OSError (such as
    FileNotFoundError) when the file cannot be opened, for the caller to word.
    """
    # O_NONBLOCK: a FIFO planted at the path must not block the open; it is then refused.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as file:
        problem = private_file_problem(os.fstat(file.fileno()))
        if problem is not None:
            raise error(f"{what} {os.fspath(path)!r} {problem}")
        return file.read()


def write_secret_file(path: Path, document: Mapping[str, Any]) -> None:
    """Write a secret JSON file atomically, readable by its owner only, from its first byte
    (:func:`write_private`)."""
    write_private(path, json.dumps(document).encode("utf-8"))


def read_secret_file(path: str | os.PathLike[str], what: str) -> bytes:
    """The bytes of a secret file, refused with KeyFileError when it cannot be read or when
    it is not private (owned by another user, or open to group or others)."""
    try:
        return read_private(path, what, KeyFileError)
    except OSError as exc:
        raise KeyFileError(
            f"cannot read {what} {os.fspath(path)!r}: {exc.strerror or exc}"
        ) from None
