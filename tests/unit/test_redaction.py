"""The filter that keeps passwords, SASL tokens and session passwords out of kazoo's logs."""

from __future__ import annotations

import logging

import pytest

from sentinel.zk.redaction import KazooSecretFilter, install_kazoo_redaction, redact


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Sending request(xid=None): Auth(type=0, scheme='digest', auth='publisher:pw')",
            "Sending request(xid=None): Auth(type=0, scheme='digest', auth='publisher:***')",
        ),
        (
            "Auth(type=0, scheme='digest', auth=\"u:it's\")",
            "Auth(type=0, scheme='digest', auth=\"u:***\")",
        ),
        ("auth='u:a\\'b\"c' done", "auth='u:***' done"),
        ("auth=b'u:pw:with:colons'", "auth=b'u:***'"),
        ("SASL(challenge=b'\\x01secret')", "SASL(challenge=***)"),
        (
            "Using session_id: 72 session_passwd: 0a1b2c3d",
            "Using session_id: 72 session_passwd: ***",
        ),
        (
            "Connect(session_id=7, passwd=b'\\x00\\x01', read_only=False)",
            "Connect(session_id=7, passwd=***, read_only=False)",
        ),
        ("nothing secret here: auth scheme digest", "nothing secret here: auth scheme digest"),
    ],
)
def test_redact(text, expected):
    assert redact(text) == expected


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("kazoo.client", logging.DEBUG, __file__, 1, msg, args, None)


def test_the_filter_redacts_what_the_arguments_format_to_and_keeps_the_record():
    record = _record("Sending request(xid=%s): %s", None, "Auth(auth='u:hunter2')")
    assert KazooSecretFilter().filter(record) is True
    assert record.getMessage() == "Sending request(xid=None): Auth(auth='u:***')"
    assert "hunter2" not in f"{record.msg} {record.args}"


def test_a_record_whose_arguments_do_not_format_is_left_to_logging():
    record = _record("%d things", "not a number")
    assert KazooSecretFilter().filter(record) is True
    assert record.args == ("not a number",)


def test_installing_twice_adds_one_filter_to_every_kazoo_logger(caplog):
    logging.getLogger("kazoo.some.later.module")
    install_kazoo_redaction()
    install_kazoo_redaction()
    for name in ("kazoo", "kazoo.client", "kazoo.protocol.connection", "kazoo.some.later.module"):
        filters = logging.getLogger(name).filters
        assert sum(isinstance(f, KazooSecretFilter) for f in filters) == 1, name
    caplog.set_level(logging.DEBUG, logger="kazoo")
    logging.getLogger("kazoo.client").debug("sending %r", "Auth(auth='admin:topsecret')")
    assert "topsecret" not in caplog.text
    assert "admin:***" in caplog.text


def test_building_a_connection_installs_the_filter_before_kazoo_can_log(monkeypatch, caplog):
    from sentinel.connection import client_arguments
    from sentinel.zk.redaction import _FILTER

    for name in ("kazoo", "kazoo.client", "kazoo.protocol.connection"):
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    client_arguments(identity="publisher:hunter2")
    caplog.set_level(logging.DEBUG, logger="kazoo")
    logging.getLogger("kazoo.protocol.connection").debug("Auth(auth='publisher:hunter2')")
    assert "hunter2" not in caplog.text
    assert _FILTER in logging.getLogger("kazoo.client").filters
