"""The multi-read reply decoder on replies a server (or whatever answers on its port) should
not send: each raises kazoo's MarshallingError at once, never part of the results."""

import struct

import pytest
from kazoo.exceptions import MarshallingError, NoAuthError, NoNodeError
from kazoo.protocol.serialization import GetChildren, GetData, int_struct

from sentinel.zk.wire import MultiRead

STAT = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
REQUEST = MultiRead((GetData("/a", None), GetData("/gone", None), GetChildren("/b", None)))


def header(kind, done=False, err=0):
    return struct.pack("!iBi", kind, int(done), err)


def field(raw, length=None):
    return int_struct.pack(len(raw) if length is None else length) + raw


def data_result(value=b"hi", length=None):
    return header(GetData.type) + field(value, length) + struct.pack("!qqqqiiiqiiq", *STAT)


def error_result(code=NoNodeError.code):
    return header(-1, err=code) + int_struct.pack(code)


def children_result(names=(b"x", b"y"), count=None):
    body = b"".join(field(name) for name in names)
    return header(GetChildren.type) + int_struct.pack(len(names) if count is None else count) + body


END = header(-1, done=True, err=-1)
REPLY = data_result() + error_result() + children_result() + END


def test_a_well_formed_reply_decodes_to_one_result_per_operation():
    (value, stat), missing, children = REQUEST.deserialize(REPLY, 0)
    assert value == b"hi" and tuple(stat) == STAT
    assert isinstance(missing, NoNodeError)
    assert children == ["x", "y"]


def test_jute_nulls_are_empty_data_and_no_children():
    reply = data_result(b"", length=-1) + error_result(NoAuthError.code)
    reply += children_result((), count=-1) + END
    (value, _), refused, children = REQUEST.deserialize(reply, 0)
    assert value == b""
    assert isinstance(refused, NoAuthError)
    assert children == []


def test_every_truncation_is_refused():
    for length in range(len(REPLY)):
        with pytest.raises(MarshallingError):
            REQUEST.deserialize(REPLY[:length], 0)


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(
            data_result(length=1000) + error_result() + children_result() + END,
            id="data-past-the-end",
        ),
        pytest.param(
            data_result(length=2**31 - 1) + error_result() + children_result() + END, id="data-2GB"
        ),
        pytest.param(
            data_result(length=-2) + error_result() + children_result() + END,
            id="data-length-negative",
        ),
        pytest.param(
            data_result()
            + error_result()
            + header(GetChildren.type)
            + int_struct.pack(1)
            + field(b"x", 9)
            + END,
            id="child-name-past-the-end",
        ),
        pytest.param(
            data_result()
            + error_result()
            + header(GetChildren.type)
            + int_struct.pack(1)
            + field(b"", -1)
            + END,
            id="null-child-name",
        ),
        pytest.param(
            data_result() + error_result() + children_result((b"\xff\xfe",)) + END,
            id="child-name-not-utf8",
        ),
    ],
)
def test_wrong_lengths_are_refused(reply):
    with pytest.raises(MarshallingError):
        REQUEST.deserialize(reply, 0)


@pytest.mark.parametrize("count", [-2, -(2**31)])
def test_negative_child_counts_are_refused(count):
    reply = data_result() + error_result() + children_result((), count=count) + END
    with pytest.raises(MarshallingError, match="children"):
        REQUEST.deserialize(reply, 0)


def test_a_huge_child_count_fails_at_the_end_of_the_reply():
    reply = data_result() + error_result() + children_result((b"x",), count=2**31 - 1) + END
    with pytest.raises(MarshallingError):
        REQUEST.deserialize(reply, 0)


@pytest.mark.parametrize("kind", [1, 5, 21, 2**31 - 1])  # create, setData, a write multi, junk
def test_an_unknown_result_type_is_refused(kind):
    reply = data_result() + header(kind) + int_struct.pack(0) + children_result() + END
    with pytest.raises(MarshallingError, match=f"type {kind}"):
        REQUEST.deserialize(reply, 0)


def test_a_result_of_another_operation_is_refused():
    # children where the data of /a was asked, and data where its children were
    reply = children_result() + error_result() + data_result() + END
    with pytest.raises(MarshallingError, match="type 8, its operation 4"):
        REQUEST.deserialize(reply, 0)


@pytest.mark.parametrize("code", [0, 1, -999, 2**31 - 1])
def test_an_unknown_error_code_is_refused(code):
    reply = data_result() + error_result(code) + children_result() + END
    with pytest.raises(MarshallingError, match=f"error code {code}"):
        REQUEST.deserialize(reply, 0)


def test_too_few_results_are_refused():
    with pytest.raises(MarshallingError, match="after 2 of 3"):
        REQUEST.deserialize(data_result() + error_result() + END, 0)


def test_too_many_results_are_refused():
    with pytest.raises(MarshallingError, match="more than its 3"):
        REQUEST.deserialize(REPLY[: -len(END)] + error_result() + END, 0)


@pytest.mark.parametrize("garbage", [b"\x00", END, b"\xff" * 100], ids=["byte", "end", "100"])
def test_bytes_after_the_end_marker_are_refused(garbage):
    with pytest.raises(MarshallingError, match="after its end"):
        REQUEST.deserialize(REPLY + garbage, 0)


def test_the_decoder_starts_at_the_offset_it_is_given():
    # kazoo hands it the whole packet, with the offset just past the reply header
    (value, _), _, children = REQUEST.deserialize(b"\x07" * 16 + REPLY, 16)
    assert (value, children) == (b"hi", ["x", "y"])
