"""The development server's files: its recorded port (``zk.port``) and its state
(``zk.json``). What a start wrote is read back; anything else in them is ignored with a warning
naming the file, never an exception, a wrong port, a blocked read or an endless one."""

import json
import logging
import os
import threading
from pathlib import Path

import pytest

from sentinel.devserver import PORT_FILE, STATE_FILE, DevServer, dev_server, recorded_port


@pytest.fixture
def port_file(monkeypatch, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("SENTINEL_STATE_DIR", str(state))
    return state / PORT_FILE


def bounded(read):
    """``read()`` run on a daemon thread: a read that blocks fails the test, not the run."""
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(read()), daemon=True)
    reader.start()
    reader.join(5)
    assert outcome, f"{read.__name__}() did not return within 5 s"
    return outcome[0]


@pytest.mark.parametrize("text", [b"2181\n", b"2181", b" 2181 \n", b"65535\n", b"1\n"])
def test_what_a_start_writes_is_read_back(port_file, caplog, text):
    port_file.write_bytes(text)
    assert recorded_port() == int(text)
    assert not caplog.records


def test_no_file_is_no_port_and_no_warning(port_file, caplog):
    assert recorded_port() is None
    assert not caplog.records


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\n", id="newline"),
        pytest.param(b"port\n", id="non-numeric"),
        pytest.param(b"-2181\n", id="negative"),
        pytest.param(b"0\n", id="zero"),
        pytest.param(b"65536\n", id="above-65535"),
        pytest.param(b"9" * 5000, id="huge"),
        pytest.param(b"2181\n" + b" " * 100, id="longer-than-a-port"),
        pytest.param(b"2181\nmore", id="trailing-text"),
        pytest.param(b"21 81\n", id="two-numbers"),
        pytest.param(b"0x885\n", id="hex"),
        pytest.param(b"2_181\n", id="underscore"),  # int() takes it
        pytest.param(b"+2181\n", id="plus"),  # int() takes it
        pytest.param("\u0662\u0661\u0668\u0661".encode(), id="arabic-indic-digits"),  # int() too
        pytest.param(b"\xff\xfe\x00\x01", id="binary"),
        pytest.param(b"\x002181", id="nul"),
    ],
)
def test_garbage_is_ignored_with_a_warning(port_file, caplog, text):
    port_file.write_bytes(text)
    with caplog.at_level(logging.WARNING, logger="sentinel.devserver"):
        assert recorded_port() is None
    (record,) = caplog.records
    assert str(port_file) in record.getMessage()
    assert "free port" in record.getMessage()


def test_a_symlink_to_a_port_file_elsewhere_is_followed(port_file, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("2181\n")
    port_file.symlink_to(elsewhere)
    assert recorded_port() == 2181


def test_a_dangling_symlink_is_no_port(port_file):
    port_file.symlink_to(port_file.parent / "gone")
    assert recorded_port() is None


def test_a_directory_is_ignored(port_file, caplog):
    port_file.mkdir()
    with caplog.at_level(logging.WARNING, logger="sentinel.devserver"):
        assert recorded_port() is None
    assert "not a regular file" in caplog.text


@pytest.mark.parametrize(("name", "read"), [(PORT_FILE, recorded_port), (STATE_FILE, dev_server)])
def test_a_fifo_elsewhere_neither_blocks_nor_is_read(port_file, tmp_path, caplog, name, read):
    # Opening a FIFO for reading waits for a writer; read_text() used to wait forever.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    port_file.with_name(name).symlink_to(fifo)
    with caplog.at_level(logging.WARNING, logger="sentinel.devserver"):
        assert bounded(read) is None
    assert "not a regular file" in caplog.text


def test_an_endless_device_is_not_read(port_file, caplog):
    # read_text() of /dev/zero never ends (and fills the memory); only a regular file is read.
    port_file.symlink_to("/dev/zero")
    with caplog.at_level(logging.WARNING, logger="sentinel.devserver"):
        assert bounded(recorded_port) is None
    assert "not a regular file" in caplog.text


# --- the state file (zk.json), read by every `sentinel zk` call --------------------------------


@pytest.fixture
def state_file(port_file):
    return port_file.with_name(STATE_FILE)


def test_the_state_a_start_writes_is_read_back(state_file):
    # This process stands in for the server: its command line holds the "directory".
    directory = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()
    state = {"pid": os.getpid(), "connect_string": "x:1", "directory": directory, "started_at": 1.5}
    state_file.write_text(json.dumps(state))
    assert bounded(dev_server) == DevServer(**state)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"[]", id="a-list"),
        pytest.param(b"\xff\xfe", id="binary"),
        pytest.param(b"[" * 100_000, id="deeply-nested"),
        pytest.param(b'{"pid": 1}', id="missing-fields"),
        pytest.param(
            b'{"pid": 1, "connect_string": "x", "directory": "/d", "started_at": 0, "x": 1}',
            id="unknown-field",
        ),
        pytest.param(  # .encode() of a number raised AttributeError out of dev_server()
            b'{"pid": 1, "connect_string": "x", "directory": 5, "started_at": 0}',
            id="directory-not-a-string",
        ),
        pytest.param(
            b'{"pid": "1", "connect_string": "x", "directory": "/d", "started_at": 0}',
            id="pid-not-a-number",
        ),
        pytest.param(b"{" + b" " * 5000 + b"}", id="longer-than-a-start-writes"),
    ],
)
def test_a_state_file_that_a_start_did_not_write_is_ignored_and_kept(state_file, caplog, text):
    state_file.write_bytes(text)
    with caplog.at_level(logging.WARNING, logger="sentinel.devserver"):
        assert bounded(dev_server) is None
    (record,) = caplog.records
    assert str(state_file) in record.getMessage()
    assert state_file.read_bytes() == text  # not ours to delete: whoever wrote it may need it


def test_a_stale_state_file_is_removed(state_file):
    state = {"pid": 2**22 + 1, "connect_string": "x", "directory": "/nowhere", "started_at": 0}
    state_file.write_text(json.dumps(state))
    assert bounded(dev_server) is None
    assert not state_file.exists()
