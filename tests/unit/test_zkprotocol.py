"""sentinel.zk.wire's records and SetWatches2 batching, without a server."""

import struct

from kazoo.exceptions import NoNodeError
from kazoo.protocol.serialization import GetChildren, GetData, int_struct, long_struct

from sentinel.zk.wire import (
    SET_WATCHES_MAX_LENGTH,
    AddWatch,
    AddWatchMode,
    MultiRead,
    SetWatches2,
    batches,
)


def test_set_watches_batches_stay_near_the_limit_and_keep_every_path_in_order():
    lists = [[f"/{kind}/{i:05d}" + "x" * 200 for i in range(900)] for kind in "decpr"]
    split = list(batches(lists))
    assert len(split) > 1
    for batch in split:
        size = sum(len(path) + int_struct.size for paths in batch for path in paths)
        longest = max(len(path) + int_struct.size for paths in batch for path in paths)
        assert size < SET_WATCHES_MAX_LENGTH + longest  # the last path may overshoot, no more
    for kind, paths in enumerate(lists):
        assert [path for batch in split for path in batch[kind]] == paths


def test_no_watches_make_no_packet():
    assert list(batches([[], [], [], [], []])) == []


def test_set_watches2_wire_format():
    record = SetWatches2(7, ["/d"], [], ["/c"], [], ["/r"]).serialize()
    expected = long_struct.pack(7)
    for paths in (["/d"], [], ["/c"], [], ["/r"]):
        expected += int_struct.pack(len(paths))
        for path in paths:
            expected += int_struct.pack(len(path)) + path.encode()
    assert record == expected


def test_add_watch_wire_format():
    assert AddWatch("/a", AddWatchMode.PERSISTENT_RECURSIVE, print, None).serialize() == (
        int_struct.pack(2) + b"/a" + int_struct.pack(1)
    )


def test_multi_read_reply_is_decoded_per_operation():
    request = MultiRead((GetData("/a", None), GetData("/gone", None), GetChildren("/b", None)))
    assert request.serialize().endswith(b"\xff\xff\xff\xff\x01\xff\xff\xff\xff")
    stat = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
    reply = (
        struct.pack("!iBi", 4, 0, 0)
        + int_struct.pack(2)
        + b"hi"
        + struct.pack("!qqqqiiiqiiq", *stat)
        + struct.pack("!iBi", -1, 0, 0)
        + int_struct.pack(-101)
        + struct.pack("!iBi", 8, 0, 0)
        + int_struct.pack(2)
        + int_struct.pack(1)
        + b"x"
        + int_struct.pack(1)
        + b"y"
        + struct.pack("!iBi", -1, 1, -1)
    )
    data, error, children = request.deserialize(reply, 0)
    assert data[0] == b"hi" and tuple(data[1]) == stat
    assert isinstance(error, NoNodeError)
    assert children == ["x", "y"]
