"""Fetched records sent with sendfile from the segment files (FileSlice): the bytes on the wire
are those of the in-memory path, partial sends resume, answers keep request order around an
in-flight sendfile, retention deleting the segment mid-send changes nothing, and a segment
truncated under a slice closes the connection instead of sending other bytes."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

import pytest
from harness import ActingController, BrokerThread, fetch_request, produce

from tidelog.broker.socket_server import DeferredResponse, RequestContext, SocketServer
from tidelog.cluster.zookeeper import pick_free_port
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.codec import decode_response, encode_request, encode_response
from tidelog.protocol.messages import fetch as m_fetch
from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.builder import (
    Record,
    build_batch,
    build_end_transaction_marker,
    build_values,
)
from tidelog.replication.types import TopicPartition
from tidelog.storage.file_io import FileSlice, OsFileIO
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig
from tidelog.storage.transactions import AppendOrigin

pytestmark = pytest.mark.integration

VERSION = 12


def _log(path: str, **props: object) -> Log:
    config = {"segment.bytes": 400_000, "index.interval.bytes": 4096, **props}
    log = Log(path, LogConfig.from_dict(config), OsFileIO())
    for i in range(60):  # ~1.2 MB: 20 KiB batches of five 4 KiB records
        log.append_as_leader(build_values([bytes([i % 251]) * 4096] * 5), 0, 0)
    log.high_watermark = log.log_end_offset
    return log


def _response(*records: Any) -> m_fetch.FetchResponse:
    return m_fetch.FetchResponse(error_code=0, session_id=0, responses=[
        m_fetch.FetchableTopicResponse(topic="t", partitions=[m_fetch.PartitionData(
            partition_index=i, error_code=0, high_watermark=60, last_stable_offset=60,
            log_start_offset=0, aborted_transactions=None, records=r)
            for i, r in enumerate(records)])])


def _expected_frame(corr: int, *records: bytes) -> bytes:
    parts = encode_response(1, corr, _response(*records), VERSION)
    return b"".join(bytes(p) for p in parts)


def _request(corr: int) -> bytes:
    req = fetch_request("t", 0, 0)
    return b"".join(bytes(b) for b in encode_request(req, VERSION, corr))


class _SliceFetches:
    """Answers every Fetch with a slice of `log` from the offset `reads[corr]` (the boundary
    that stands in for KafkaApis); correlation ids in `deferred` are answered through a
    DeferredResponse, resolved when the next request arrives."""

    def __init__(self, log: Log, reads: dict[int, tuple[int, int]],
                 deferred: frozenset[int] = frozenset(),
                 wait_for: dict[int, Callable[[], bool]] | None = None,
                 copied_first: frozenset[int] = frozenset()) -> None:
        self.log = log
        # these answers carry the same records twice: in memory first, then as the slice
        self.copied_first = copied_first
        self.reads = reads
        self.deferred = deferred
        self.wait_for = wait_for or {}
        self.pending: asyncio.Future[Any] | None = None

    def expected(self, corr: int) -> bytes:
        offset, max_bytes = self.reads[corr]
        records = bytes(self.log.read(offset, max_bytes).records)
        return _expected_frame(corr, *([records] * (2 if corr in self.copied_first else 1)))

    async def __call__(self, ctx: RequestContext, request: Any) -> Any:
        assert ctx.header.request_api_key == ApiKey.FETCH
        corr = ctx.header.correlation_id
        offset, max_bytes = self.reads[corr]
        records = self.log.read_slice(offset, max_bytes, min_slice_bytes=1).records
        assert isinstance(records, FileSlice)
        if self.pending is not None:
            self.pending.set_result(None)
            self.pending = None
        condition = self.wait_for.get(corr)
        for _ in range(10_000):  # at most ~10 s
            if condition is None or condition():
                break
            await asyncio.sleep(0.001)
        answer = ((self.log.read(offset, max_bytes).records.tobytes(), records)
                  if corr in self.copied_first else (records,))
        if corr in self.deferred:
            self.pending = asyncio.get_running_loop().create_future()
            return DeferredResponse(self.pending, lambda _: _response(*answer))
        return _response(*answer)


class _SendfileSpy:
    """Counts the real os.sendfile calls and the bytes each sent; notes a call made while a
    connection's transport still buffers earlier bytes (they would come after the slice's)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[int] = []
        self.server: SocketServer | None = None
        self.behind_buffered_bytes = 0
        real = os.sendfile

        def spy(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
            if self.server is not None and any(
                    w.transport.get_write_buffer_size() for w in self.server._writers.values()):
                self.behind_buffered_bytes += 1
            n = real(out_fd, in_fd, offset, count)
            self.sent.append(n)
            return n

        monkeypatch.setattr(os, "sendfile", spy)


async def _slow_client(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    s.setblocking(False)
    await asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=s, limit=4096)


async def _read_frame(r: asyncio.StreamReader, pause: Callable[[int], Any] | None = None) -> bytes:
    """One response frame (with its size prefix), read 2 KiB at a time with a pause."""
    head = await asyncio.wait_for(r.readexactly(4), 10)
    size = struct.unpack(">i", head)[0]
    data = bytearray(head)
    while len(data) < size + 4:
        chunk = await asyncio.wait_for(r.read(min(2048, size + 4 - len(data))), 10)
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {size + 4} bytes")
        data += chunk
        if pause is not None:
            await pause(len(data))
    return bytes(data)


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Any], Any]:
    """Each scenario on asyncio's loop and on uvloop (the broker's loop when installed)."""
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.run  # type: ignore[no-any-return]
    return asyncio.run


def _server(handler: Any) -> SocketServer:
    return SocketServer("127.0.0.1", pick_free_port(), handler, send_buffer_bytes=4096)


def _open_slices() -> list[FileSlice]:
    gc.collect()
    return [o for o in gc.get_objects() if type(o) is FileSlice and o.fileno() >= 0]


def test_sliced_answers_are_the_in_memory_bytes_in_request_order_across_partial_sends(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, run: Callable[[Any], Any]
) -> None:
    """Pipelined fetches in one read: an immediate one, a deferred one, one queued behind it,
    one answered while the queue's sendfile of those two is still in flight (it must queue
    behind them, not write into the middle), and one whose slice follows 400 KB of records
    in memory (still in the transport's buffer: the slice must wait for them). Every frame
    equals the in-memory encoding, and sendfile sent in many pieces."""
    spy = _SendfileSpy(monkeypatch)
    log = _log(f"{tmp_path}/t-0")
    reads = {1: (0, 300_000), 2: (7, 500_000), 3: (20, 1 << 20), 4: (33, 200_000),
             5: (3, 400_000)}

    def queue_mid_send() -> bool:  # the deferred answer's slice is partly sent
        return sum(spy.sent) >= 300_000 + 100_000

    async def scenario() -> list[tuple[bytes, bytes]]:
        handler = _SliceFetches(log, reads, deferred=frozenset({2}), wait_for={4: queue_mid_send},
                                copied_first=frozenset({5}))
        server = spy.server = _server(handler)
        port = await server.start()
        try:
            r, w = await _slow_client(port)
            w.write(b"".join(_request(corr) for corr in reads))
            await w.drain()
            got = [await _read_frame(r, lambda _: asyncio.sleep(0.0005)) for _ in reads]
            w.close()
            return [(frame, handler.expected(corr)) for corr, frame in zip(reads, got, strict=True)]
        finally:
            await server.shutdown()

    for frame, expected in run(scenario()):
        assert frame == expected
    assert sum(spy.sent) >= 4 * 200_000 and len(spy.sent) > 20  # partial sends happened
    assert spy.behind_buffered_bytes == 0
    assert _open_slices() == []  # every slice's descriptor closed
    log.close()


async def _one_slow_fetch(log: Log, read: tuple[int, int],
                          during: Callable[[int], None]) -> bytes:
    """One sliced fetch answer read slowly; `during(bytes received so far)` after each piece."""
    server = _server(_SliceFetches(log, {1: read}))
    port = await server.start()
    try:
        r, w = await _slow_client(port)
        w.write(_request(1))
        await w.drain()

        async def pause(received: int) -> None:
            during(received)
            await asyncio.sleep(0.0005)

        try:
            return await _read_frame(r, pause)
        finally:
            w.close()
    finally:
        await server.shutdown()


def test_retention_deleting_the_segment_mid_send_leaves_the_answer_whole(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, run: Callable[[Any], Any]
) -> None:
    spy = _SendfileSpy(monkeypatch)
    log = _log(f"{tmp_path}/r-0", **{"retention.bytes": 400_000, "file.delete.delay.ms": 0})
    first_segment = os.path.basename(log.segments[0].log_path)
    expected = _expected_frame(1, log.read(0, 350_000).records.tobytes())
    deleted: list[int] = []

    def delete_once(received: int) -> None:
        if received > 20_000 and not deleted:
            deleted.append(log.delete_old_segments(now_ms=0))
            assert first_segment not in os.listdir(log.dir)

    frame = run(_one_slow_fetch(log, (0, 350_000), delete_once))
    assert deleted and deleted[0] >= 1 and log.log_start_offset > 0
    assert frame == expected and len(spy.sent) > 1
    log.close()


def test_a_segment_truncated_under_a_slice_closes_the_connection(
    tmp_path: object, run: Callable[[Any], Any]
) -> None:
    """The slice was validated as whole batches; once the file is shorter than it, the rest
    of the frame cannot be sent: the connection closes (Kafka's "truncated during write")
    instead of hanging or sending bytes that were never validated."""
    log = _log(f"{tmp_path}/c-0")

    def truncate_once(received: int) -> None:
        if received > 20_000 and log.log_end_offset > 10:
            assert log.truncate_to(10)

    with pytest.raises(ConnectionError, match="closed after"):
        run(_one_slow_fetch(log, (0, 1 << 20), truncate_once))
    log.close()


# ---------------------------------------------------------------- a real broker


def _raw_fetch(port: int, topic: str, corr: int, offset: int = 0,
               isolation_level: int = 0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        req = fetch_request(topic, 0, offset, max_bytes=4 << 20)
        req.isolation_level = isolation_level
        s.sendall(b"".join(bytes(b) for b in encode_request(req, VERSION, corr)))
        data = bytearray()
        while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
            chunk = s.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return bytes(data)


def test_a_broker_answers_the_same_bytes_with_and_without_sendfile(
    one_broker: BrokerThread, controller: ActingController, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker's own fetch path (KafkaApis, the replica manager, Log.read_slice, the
    socket server) on large batches: the frame is byte for byte the in-memory path's, and a
    librdkafka consumer reads every record."""
    spy = _SendfileSpy(monkeypatch)  # the broker runs in this process (its own thread)
    controller.create_topic("zc", {0: [1]})
    values = [bytes([65 + i % 26]) * 20_000 + str(i).encode() for i in range(50)]
    for i in range(0, 50, 5):
        assert produce(one_broker.port, "zc", 0, build_values(values[i:i + 5]), acks=1)[0] == 0
    core = one_broker.server.replica_manager.core
    assert core.config.zero_copy_min_bytes is not None
    with_sendfile, in_memory = _both_ways(one_broker, spy, lambda: _raw_fetch(
        one_broker.port, "zc", 7))
    assert with_sendfile == in_memory

    confluent_kafka = pytest.importorskip("confluent_kafka")
    consumer = confluent_kafka.Consumer({"bootstrap.servers": one_broker.bootstrap,
                                         "group.id": "zc", "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition("zc", 0, 0)])
    got: list[bytes] = []
    try:
        for _ in range(200):  # bounded: ~40 s at most
            if len(got) == len(values):
                break
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg.value())
    finally:
        consumer.close()
    assert got == values


def _both_ways(broker: BrokerThread, spy: _SendfileSpy,
               fetch: Callable[[], bytes]) -> tuple[bytes, bytes]:
    """`fetch()`'s frame with the broker's sendfile path (which must send by sendfile), then
    with the core's zero-copy reads turned off (which must not)."""
    core = broker.server.replica_manager.core
    zero_copy = core.config
    assert zero_copy.zero_copy_min_bytes is not None
    sent = sum(spy.sent)
    with_sendfile = fetch()
    assert sum(spy.sent) - sent >= zero_copy.zero_copy_min_bytes
    broker.call(lambda: setattr(core, "config", zero_copy.with_(zero_copy_min_bytes=None)))
    try:
        calls = len(spy.sent)
        in_memory = fetch()
        assert len(spy.sent) == calls
    finally:
        broker.call(lambda: setattr(core, "config", zero_copy))
    return with_sendfile, in_memory


def _txn(pid: int, value: bytes, seq: int) -> bytearray:
    return build_batch([Record(value=value)], producer_id=pid, producer_epoch=0,
                       base_sequence=seq, transactional=True)


def test_read_committed_slices_stop_at_the_lso_with_the_same_aborted_transactions(
    one_broker: BrokerThread, controller: ActingController, monkeypatch: pytest.MonkeyPatch
) -> None:
    """READ_COMMITTED: the slice ends at the last stable offset (a batch boundary) and lists
    the aborted transactions the in-memory path lists, from every start offset."""
    spy = _SendfileSpy(monkeypatch)
    controller.create_topic("zc-rc", {0: [1]})
    port = one_broker.port

    def marker(pid: int, commit: bool) -> None:
        def append() -> None:
            p = one_broker.server.replica_manager.core.partition(TopicPartition("zc-rc", 0))
            p.log.append_as_leader(build_end_transaction_marker(
                commit=commit, producer_id=pid, producer_epoch=0, coordinator_epoch=0),
                p.leader_epoch, 0, AppendOrigin.COORDINATOR)
            p.maybe_increment_leader_hw()
        one_broker.call(append)

    big = [bytes([97 + i]) * 150_000 for i in range(10)]
    for pid, value, seq in [(21, big[0], 0), (22, big[1], 0), (21, big[2], 1),
                            (22, big[3], 1)]:  # 0-3
        assert produce(port, "zc-rc", 0, _txn(pid, value, seq), transactional_id=f"t{pid}")[0] == 0
    marker(21, commit=False)  # 4
    marker(22, commit=True)  # 5
    assert produce(port, "zc-rc", 0, _txn(23, big[4], 0), transactional_id="t23")[0] == 0  # 6: open, so the LSO is 6
    assert produce(port, "zc-rc", 0, _txn(24, big[5], 0), transactional_id="t24")[0] == 0  # 7
    marker(24, commit=False)  # 8: aborted, but after the LSO: no reader up to it lists it
    for offset in (0, 1, 2):  # (from 2: 300 KB, the smallest read over the threshold)
        with_sendfile, in_memory = _both_ways(one_broker, spy, lambda o=offset: _raw_fetch(
            port, "zc-rc", 9, o, isolation_level=1))
        assert with_sendfile == in_memory
    _, answer = decode_response(ApiKey.FETCH, VERSION, with_sendfile[4:])
    data = answer.responses[0].partitions[0]
    assert (data.high_watermark, data.last_stable_offset) == (9, 6)
    assert [(a.producer_id, a.first_offset) for a in data.aborted_transactions] == [(21, 0)]
    assert [b.last_offset for b in iter_batches(data.records)] == [2, 3, 4, 5]  # (from 2)
