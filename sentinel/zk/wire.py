"""ZooKeeper 3.6+ requests kazoo 2.11 does not have, as kazoo's serialization records: pure
codecs, no I/O and no kazoo internals (:mod:`sentinel.zk.watches` sends them).

``addWatch`` (106), ``removeWatches`` (18), ``SetWatches2`` (105) and multi-read (22) with its
reply decoder, and the Java client's split of the watches re-registered on a reconnection into
packets (:func:`batches`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import IntEnum
from typing import Any, NamedTuple

from kazoo.exceptions import EXCEPTIONS, MarshallingError
from kazoo.protocol.serialization import (
    GetChildren,
    GetData,
    MultiHeader,
    int_struct,
    long_struct,
    multiheader_struct,
    stat_struct,
    write_string,
)
from kazoo.protocol.states import WatchedEvent, ZnodeStat

__all__ = [
    "ADD_WATCH",
    "MULTI_READ",
    "REMOVE_WATCHES",
    "SET_WATCHES2",
    "SET_WATCHES_MAX_LENGTH",
    "SET_WATCHES_XID",
    "AddWatch",
    "AddWatchMode",
    "MultiRead",
    "RemoveWatches",
    "SetWatches2",
    "WatcherType",
    "batches",
]

Watcher = Callable[[WatchedEvent], Any]

# ZooDefs.OpCode
REMOVE_WATCHES = 18
MULTI_READ = 22
SET_WATCHES2 = 105
ADD_WATCH = 106
# ClientCnxn: the xid of SetWatches packets (the server echoes it), and the size the Java
# client keeps each under, well below the server's 1 MB jute.maxbuffer (ZOOKEEPER-706).
SET_WATCHES_XID = -8
SET_WATCHES_MAX_LENGTH = 128 * 1024
_ERROR_RESULT = -1  # ZooDefs.OpCode.error: a multi's per-operation error


class AddWatchMode(IntEnum):
    """``org.apache.zookeeper.AddWatchMode``."""

    PERSISTENT = 0  # data and child events of the path, until removed
    PERSISTENT_RECURSIVE = 1  # created/deleted/changed events of the path and all below it


class WatcherType(IntEnum):
    """``org.apache.zookeeper.Watcher.WatcherType``: what
    :meth:`~sentinel.zk.watches.PersistentWatches.remove_watches`
    removes."""

    CHILDREN = 1
    DATA = 2
    ANY = 3
    PERSISTENT = 4
    PERSISTENT_RECURSIVE = 5


class AddWatch(NamedTuple):
    """``AddWatchRequest {path, mode}``; the watcher is registered when the reply arrives."""

    path: str
    mode: AddWatchMode
    callback: Watcher
    known: Callable[[], Iterable[str]] | None
    absolute: bool = False  # path given from the server's root, not the client's chroot
    on_connection_thread: bool = False  # called where the event is read, not handed off
    type = ADD_WATCH

    def serialize(self) -> bytes:
        return write_string(self.path) + int_struct.pack(self.mode)

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> bool:
        return True


class RemoveWatches(NamedTuple):
    """``RemoveWatchesRequest {path, type}``."""

    path: str
    watcher_type: WatcherType
    type = REMOVE_WATCHES

    def serialize(self) -> bytes:
        return write_string(self.path) + int_struct.pack(self.watcher_type)

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> bool:
        return True


class SetWatches2(NamedTuple):
    """``SetWatches2 {relativeZxid, dataWatches, existWatches, childWatches,
    persistentWatches, persistentRecursiveWatches}``."""

    relative_zxid: int
    data: list[str]
    exist: list[str]
    child: list[str]
    persistent: list[str]
    recursive: list[str]
    type = SET_WATCHES2

    def serialize(self) -> bytes:
        out = bytearray(long_struct.pack(self.relative_zxid))
        for paths in (self.data, self.exist, self.child, self.persistent, self.recursive):
            out += int_struct.pack(len(paths))
            for path in paths:
                out += write_string(path)
        return bytes(out)


class MultiRead(NamedTuple):
    """``MultiOperationRecord`` of GetData/GetChildren requests (no watches set)."""

    operations: tuple[GetData | GetChildren, ...]
    type = MULTI_READ

    def serialize(self) -> bytes:
        out = bytearray()
        for op in self.operations:
            out += MultiHeader(op.type, False, -1).serialize() + op.serialize()
        return bytes(out + multiheader_struct.pack(-1, True, -1))

    def deserialize(self, data: bytes, offset: int) -> list[Any]:
        """One result per operation, in their order: ``(bytes, ZnodeStat)`` for a GetData, a
        child list for a GetChildren, or the exception of that one operation.

        A reply that is not exactly that (cut short, a length past its end, a result of
        another kind than its operation, an unknown error code, a result too many or too few,
        bytes after its end marker) raises kazoo's
        :class:`~kazoo.exceptions.MarshallingError`: the caller gets no result rather than
        some. Every step consumes bytes, so a hostile reply cannot keep the decoder looping.
        """
        try:
            results, offset = self._decode(data, offset)
        except (struct.error, UnicodeDecodeError) as exc:
            raise MarshallingError(f"multi-read reply cut short or malformed: {exc}") from exc
        if offset != len(data):
            raise MarshallingError(f"multi-read reply has {len(data) - offset} bytes after its end")
        return results

    def _decode(self, data: bytes, offset: int) -> tuple[list[Any], int]:
        results: list[Any] = []
        for op in self.operations:
            header, offset = MultiHeader.deserialize(data, offset)
            if header.done:
                raise MarshallingError(
                    f"multi-read reply ends after {len(results)} of {len(self.operations)} results"
                )
            if header.type == _ERROR_RESULT:
                (code,) = int_struct.unpack_from(data, offset)
                offset += int_struct.size
                error = EXCEPTIONS.get(code) if code else None  # .get: no defaultdict factory
                if error is None:
                    raise MarshallingError(f"multi-read result with unknown error code {code}")
                results.append(error())
            elif header.type != op.type:
                raise MarshallingError(
                    f"multi-read result {len(results)} has type {header.type}, "
                    f"its operation {op.type}"
                )
            elif op.type == GetData.type:
                value, offset = _read_field(data, offset)
                stat = ZnodeStat._make(stat_struct.unpack_from(data, offset))
                offset += stat_struct.size
                results.append((value or b"", stat))
            else:
                (count,) = int_struct.unpack_from(data, offset)
                offset += int_struct.size
                if count < -1:  # -1 is jute's null list
                    raise MarshallingError(f"multi-read result with {count} children")
                children = []
                for _ in range(count):
                    child, offset = _read_field(data, offset)
                    if child is None:
                        raise MarshallingError("multi-read result with a null child name")
                    children.append(child.decode("utf-8"))
                results.append(children)
        header, offset = MultiHeader.deserialize(data, offset)
        if not header.done:
            raise MarshallingError(
                f"multi-read reply has more than its {len(self.operations)} results"
            )
        return results, offset


def _read_field(data: bytes, offset: int) -> tuple[bytes | None, int]:
    """A jute buffer or string at ``offset`` (None for null) and the offset after it; kazoo's
    read_buffer returns a cut value for a length past the end of ``data``."""
    (length,) = int_struct.unpack_from(data, offset)
    offset += int_struct.size
    if length == -1:
        return None, offset
    if length < 0 or offset + length > len(data):
        raise MarshallingError(
            f"multi-read reply: a field of {length} bytes at offset {offset} of {len(data)}"
        )
    return data[offset : offset + length], offset + length


def batches(lists: Sequence[list[str]]) -> Iterator[list[list[str]]]:
    """Split the five watch lists into batches of about SET_WATCHES_MAX_LENGTH bytes of paths,
    in the Java client's order (the last path of a batch may overshoot a little, as there)."""
    position = [0] * len(lists)
    while any(position[i] < len(paths) for i, paths in enumerate(lists)):
        batch: list[list[str]] = [[] for _ in lists]
        size = 0
        for i, paths in enumerate(lists):
            while position[i] < len(paths) and size < SET_WATCHES_MAX_LENGTH:
                path = paths[position[i]]
                batch[i].append(path)
                size += len(path.encode("utf-8")) + int_struct.size
                position[i] += 1
        yield batch
