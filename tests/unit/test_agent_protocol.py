"""The host agent's frames without a socket: read in pieces, bounded, encoded once in UTF-8."""

from __future__ import annotations

import json
import struct

import pytest

from sentinel.agentlink import protocol
from sentinel.errors import AgentProtocolError
from sentinel.registry.records import utf8_json


def test_frames_read_in_pieces_come_out_whole_and_in_order():
    messages = [{"op": "follow", "id": i, "service": f"s{i}"} for i in range(3)]
    stream = b"".join(protocol.encode(m) for m in messages)
    reader = protocol.FrameReader(protocol.MAX_REQUEST_BYTES, protocol.REQUESTS)
    out = []
    for i in range(0, len(stream), 5):  # a few bytes at a time, splitting lengths and bodies
        out += reader.feed(stream[i : i + 5])
        assert reader.partial == (len(out) < 3)
    assert out == messages


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (struct.pack(">I", 65) + b"{}", "at most 64"),
        (struct.pack(">I", 2) + b"[]", "unknown message"),
        (protocol.encode({"op": "drop-tables"}), "unknown message"),
        (struct.pack(">I", 3) + b"\xff{{", "not JSON"),
    ],
)
def test_a_frame_that_is_not_a_request_is_refused(data, match):
    reader = protocol.FrameReader(64, protocol.REQUESTS)
    with pytest.raises(AgentProtocolError, match=match):
        reader.feed(data)


def test_characters_outside_ascii_cost_their_utf8_bytes_not_an_escape():
    value = {"b": "😀" * 1000}
    data = utf8_json(value)
    assert len(data) == 4000 + len('{"b":""}')  # escaped, each would be 12 bytes
    assert json.loads(data) == value
    frame = protocol.encode({"op": "heartbeat", **value})
    assert len(frame) == 4 + len(utf8_json({"op": "heartbeat", **value}))
    assert protocol.decode(frame[4:], frozenset({"heartbeat"}))["b"] == value["b"]


def test_a_lone_surrogate_is_escaped_rather_than_refused():
    value = {"b": "\ud800x"}  # JSON text may carry one; UTF-8 cannot
    data = utf8_json(value)
    assert data.isascii() and json.loads(data) == value


STATUS = {"op": "status", "id": 1, "state": "connected", "staleness": 0.0, "processes": []}


@pytest.mark.parametrize(
    "regions",
    [
        "b",
        ["b"],
        [{"region": "b", "state": "connected", "staleness": "0", "processes": 1}],
        [{"region": "b", "state": "connected", "staleness": 0.0, "processes": True}],
        [{"region": 7, "state": "connected", "staleness": 0.0, "processes": 1}],
    ],
)
def test_an_agents_status_with_regions_of_the_wrong_shape_is_refused(regions):
    """``sentinel agent status`` reads the agent as untrusted: its regions' fields too."""
    from sentinel.cli.agent import _checked_status

    with pytest.raises(AgentProtocolError):
        _checked_status({**STATUS, "regions": regions})


def test_an_agents_status_without_regions_is_read_as_none():
    """An agent from before regions sends no ``regions``: read as none, not an error."""
    from sentinel.cli.agent import _checked_status

    assert _checked_status(STATUS)["regions"] == []
    region = {"region": "b", "state": "unopened", "staleness": None, "processes": None}
    assert _checked_status({**STATUS, "regions": [region]})["regions"] == [region]
