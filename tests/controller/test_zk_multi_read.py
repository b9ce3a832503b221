"""ZooKeeper's multiRead request and response as bytes (ZooKeeper's MultiOperationRecord and
MultiResponse of getData operations)."""

from __future__ import annotations

import struct

from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from tidelog.controller.zk_multi_read import MultiRead

STAT = ZnodeStat(czxid=7, mzxid=8, ctime=9, mtime=10, version=3, cversion=0, aversion=0,
                 ephemeralOwner=0, dataLength=2, numChildren=0, pzxid=7)


def header(kind: int, done: bool, err: int) -> bytes:
    return struct.pack("!iBi", kind, done, err)


def stat_bytes(stat: ZnodeStat) -> bytes:
    return struct.pack("!qqqqiiiqiiq", *stat)


def test_a_multi_read_asks_each_path_as_a_get_data_without_a_watch() -> None:
    assert MultiRead.type == 22  # ZooDefs.OpCode.multiRead
    assert bytes(MultiRead(["/a", "/bc"]).serialize()) == (
        header(4, False, -1) + struct.pack("!i", 2) + b"/a" + b"\x00"
        + header(4, False, -1) + struct.pack("!i", 3) + b"/bc" + b"\x00"
        + header(-1, True, -1))


def test_each_read_of_the_answer_is_data_and_stat_or_its_error_in_order() -> None:
    answer = (b"junk"  # (what precedes the offset: the reply header)
              + header(4, False, 0) + struct.pack("!i", 2) + b"{}" + stat_bytes(STAT)
              + header(-1, False, -101) + struct.pack("!i", -101)
              + header(4, False, 0) + struct.pack("!i", -1) + stat_bytes(STAT)
              + header(-1, False, -102) + struct.pack("!i", -102)
              + header(-1, True, -1))
    first, missing, empty, refused = MultiRead.deserialize(answer, 4)
    assert first == (b"{}", STAT)
    assert isinstance(missing, NoNodeError)
    assert empty == (None, STAT)
    assert isinstance(refused, NoAuthError)


def test_an_empty_answer_reads_nothing() -> None:
    assert MultiRead.deserialize(header(-1, True, -1), 0) == []
