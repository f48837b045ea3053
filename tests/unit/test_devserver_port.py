"""The development server's recorded port (``zk.port``): what a start wrote is read back, and
anything else in that file is ignored with a warning naming it, never an exception, a wrong
port, a blocked read or an endless one."""

import logging
import os
import threading

import pytest

from sentinel.devserver import PORT_FILE, recorded_port


@pytest.fixture
def port_file(monkeypatch, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("SENTINEL_STATE_DIR", str(state))
    return state / PORT_FILE


def bounded_recorded_port():
    """recorded_port() run on a daemon thread: a read that blocks fails the test, not the run."""
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(recorded_port()), daemon=True)
    reader.start()
    reader.join(5)
    assert outcome, "recorded_port() did not return within 5 s"
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


def test_a_fifo_elsewhere_neither_blocks_nor_is_read(port_file, tmp_path, caplog):
    # Opening a FIFO for reading waits for a writer; read_text() used to wait forever.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    port_file.symlink_to(fifo)
    with caplog.at_level(logging.WARNING, logger="sentinel.devserver"):
        assert bounded_recorded_port() is None
    assert "not a regular file" in caplog.text


def test_an_endless_device_is_not_read(port_file, caplog):
    # read_text() of /dev/zero never ends (and fills the memory); only a regular file is read.
    port_file.symlink_to("/dev/zero")
    with caplog.at_level(logging.WARNING, logger="sentinel.devserver"):
        assert bounded_recorded_port() is None
    assert "not a regular file" in caplog.text
