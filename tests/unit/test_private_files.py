"""Secret files (key rings, signing keys, identities, credential files) and the snapshot are
written with mkstemp + fsync + rename, never through a planted name, and refused on load when
another user owns them or group or others may read or write them."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from sentinel.auth.acl import load_client_identity, load_identities
from sentinel.auth.backends import FileBackend
from sentinel.auth.keys import ClientKeyring, ManagerKey
from sentinel.cache.snapshot_file import load_snapshot
from sentinel.errors import AuthError, KeyFileError, SentinelError, SnapshotRejected
from sentinel.private_files import read_private, write_private

VICTIM_TEXT = "the victim's own content\n"


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _save_ring(path: Path) -> None:
    ClientKeyring.generate().save(path)


def _save_manager_key(path: Path) -> None:
    ManagerKey.generate().save(path)


def _save_identities(path: Path) -> None:
    load_identities(path, create_missing=True)


def _save_client_identity(path: Path) -> None:
    load_client_identity(path, "app", create_missing=True)


def _save_credentials(path: Path) -> None:
    FileBackend(path).create("db", "app", 1)


def _load_client_identity(path: Path) -> str:
    return load_client_identity(path, "app")


def _load_credentials(path: Path) -> bool:
    return FileBackend(path).accepts("db", "app", {})


def _save_snapshot(path: Path) -> None:
    write_private(path, b'{"format": "sentinel-snapshot"}')


# (what, how to write one through its public API, how to load it, the error a refusal raises)
FILES: list[tuple[str, Callable[[Path], None], Callable[[Path], object], type[SentinelError]]] = [
    ("key ring", _save_ring, ClientKeyring.load, KeyFileError),
    ("manager key", _save_manager_key, ManagerKey.load, KeyFileError),
    ("identities", _save_identities, load_identities, KeyFileError),
    ("client identity", _save_client_identity, _load_client_identity, KeyFileError),
    ("credentials", _save_credentials, _load_credentials, AuthError),
    ("snapshot", _save_snapshot, lambda p: load_snapshot(p, "/sentinel", "h:1"), SnapshotRejected),
]  # fmt: skip
IDS = [entry[0] for entry in FILES]
# These read what is at the target before they rewrite it.
READ_FIRST = ("identities", "client identity", "credentials")


@pytest.mark.parametrize(("what", "save", "load", "error"), FILES, ids=IDS)
def test_a_file_written_private_is_mode_0600_even_under_a_permissive_umask(
    tmp_path, what, save, load, error
):
    path = tmp_path / "secret.json"
    old = os.umask(0)
    try:
        save(path)
    finally:
        os.umask(old)
    assert _mode(path) == 0o600
    assert os.listdir(tmp_path) == ["secret.json"], "a temporary file was left behind"


@pytest.mark.parametrize(("what", "save", "load", "error"), FILES, ids=IDS)
def test_names_planted_beside_the_target_are_never_written_through(
    tmp_path, what, save, load, error
):
    """The old writer used ``.<name>.tmp-<pid>``: a file or a symlink planted there (or at any
    other guessable name) is left alone, and the target still ends up 0600."""
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    path = tmp_path / "secret.json"
    planted_link = tmp_path / f".secret.json.tmp-{os.getpid()}"
    planted_link.symlink_to(victim)
    planted_file = tmp_path / ".secret.json.tmp"
    planted_file.write_text("planted")
    os.chmod(planted_file, 0o644)
    save(path)
    assert victim.read_text() == VICTIM_TEXT and _mode(victim) == 0o644
    assert planted_link.is_symlink() and planted_file.read_text() == "planted"
    assert path.is_file() and not path.is_symlink() and _mode(path) == 0o600


@pytest.mark.parametrize(("what", "save", "load", "error"), FILES, ids=IDS)
def test_a_symlink_planted_at_the_target_is_replaced_not_followed(
    tmp_path, what, save, load, error
):
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    path = tmp_path / "secret.json"
    path.symlink_to(victim)
    if what in READ_FIRST:  # the link is read, and refused: the victim is not private
        with pytest.raises(error, match="has mode 0644"):
            save(path)
        assert path.is_symlink()
    else:
        save(path)
        assert not path.is_symlink() and _mode(path) == 0o600
    assert victim.read_text() == VICTIM_TEXT and _mode(victim) == 0o644


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602])
@pytest.mark.parametrize(("what", "save", "load", "error"), FILES, ids=IDS)
def test_a_file_open_to_group_or_others_is_refused_on_load(tmp_path, what, save, load, error, mode):
    path = tmp_path / "secret.json"
    save(path)
    os.chmod(path, mode)
    with pytest.raises(error, match=f"has mode {mode:04o}: group or others may read or write"):
        load(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
@pytest.mark.parametrize(("what", "save", "load", "error"), FILES, ids=IDS)
def test_a_file_owned_by_another_user_is_refused_on_load(tmp_path, what, save, load, error):
    path = tmp_path / "secret.json"
    save(path)
    os.chown(path, 65534, 65534)
    assert _mode(path) == 0o600
    with pytest.raises(error, match="is owned by uid 65534, not by this user"):
        load(path)


def test_a_symlink_to_a_private_file_loads_and_one_to_an_open_file_does_not(tmp_path):
    ring = ClientKeyring.generate()
    real = tmp_path / "real.keys"
    ring.save(real)
    link = tmp_path / "link.keys"
    link.symlink_to(real)
    assert ClientKeyring.load(link).key_ids == ring.key_ids
    os.chmod(real, 0o644)
    with pytest.raises(KeyFileError, match="has mode 0644"):
        ClientKeyring.load(link)


def test_a_fifo_or_a_directory_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    done = threading.Event()
    errors: list[BaseException] = []

    def load() -> None:
        try:
            ClientKeyring.load(fifo)
        except BaseException as exc:
            errors.append(exc)
        done.set()

    threading.Thread(target=load, daemon=True).start()
    assert done.wait(10), "loading a FIFO blocked"
    assert isinstance(errors[0], KeyFileError) and "is not a regular file" in str(errors[0])
    with pytest.raises(KeyFileError):
        ClientKeyring.load(tmp_path)


def test_refusals_name_the_file_never_its_content(tmp_path):
    path = tmp_path / "client.keys"
    ring = ClientKeyring.generate()
    ring.save(path)
    secret = path.read_text()
    os.chmod(path, 0o644)
    with pytest.raises(KeyFileError) as refused:
        ClientKeyring.load(path)
    assert str(path) in str(refused.value)
    assert all(part not in str(refused.value) for part in secret.split('"') if len(part) > 20)


def test_read_private_leaves_a_missing_file_to_the_caller(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_private(tmp_path / "missing", "key file", KeyFileError)
    with pytest.raises(SnapshotRejected, match="does not exist"):
        load_snapshot(tmp_path / "missing", "/sentinel", "h:1")
