"""A compacted topic on real processes (issue 16): brokers clean while records stream in, the
preferred leader is killed with -9 in the middle of it and restarted, and a consumer's
fetches from the beginning of the restarted broker's log (the only live replica at the
end) get every key's latest value, from a log the cleaner has shrunk.

Segments roll every 4 KiB and the cleaner backs off 100 ms, so a cleaning pass is running or
due most of the time when the kill comes; wherever it lands (a `.cleaned` or `.swap` file left
behind, or none), the restarted broker loads a valid log and catches up.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from real_cluster_harness import RealCluster, produce_acked, producer, running_cluster, wait_for

from tidelog.client.connection import BrokerConnection
from tidelog.protocol.messages.fetch import FetchPartition, FetchRequest, FetchTopic
from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.decoder import decode_records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

KEYS = 40


@pytest.fixture(scope="module")
def cleaning_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    d: Path = tmp_path_factory.mktemp("compaction")
    with running_cluster(d, {"log.cleaner.backoff.ms": "100"}) as c:
        yield c


def burst(p: object, start: int, n: int) -> list[tuple[bytes, bytes]]:
    records = [(b"key-%d" % (i % KEYS), b"value-%d-" % i + b"x" * 100) for i in range(start, start + n)]
    produce_acked(p, "compacted", records, partition=0)
    return records


def read_from_the_beginning(port: int, topic: str) -> list[tuple[bytes | None, bytes | None, int]]:
    """Every record of partition 0 below its high watermark, fetched from one broker over the
    wire (a consumer's fetch, replica id -1)."""

    async def read() -> list[tuple[bytes | None, bytes | None, int]]:
        conn = BrokerConnection("127.0.0.1", port, request_timeout_ms=10000)
        await conn.connect(timeout_s=10)
        out: list[tuple[bytes | None, bytes | None, int]] = []
        offset = 0
        try:
            for _ in range(10_000):
                r = await conn.send(FetchRequest(
                    replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                    topics=[FetchTopic(topic=topic, partitions=[FetchPartition(
                        partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)])]))
                part = r.responses[0].partitions[0]
                assert part.error_code == 0, part
                if offset >= part.high_watermark:
                    return out
                for batch in iter_batches(part.records):
                    out.extend((rec.key, rec.value, rec.offset) for rec in decode_records(batch)
                               if rec.offset >= offset)
                    offset = batch.last_offset + 1
            raise AssertionError("the fetch loop did not reach the high watermark")
        finally:
            await conn.close()

    return asyncio.run(read())


def test_a_compacted_topic_survives_a_broker_killed_while_cleaning(
        cleaning_cluster: RealCluster) -> None:
    from tidelog.controller.admin import AdminZkClient

    c = cleaning_cluster
    AdminZkClient(c.zk).create_topic("compacted", 0, 0, replica_assignment={0: [1, 2, 3]},
                                     config={"cleanup.policy": "compact", "segment.bytes": "4096",
                                             "min.cleanable.dirty.ratio": "0.01",
                                             # broker 1 alone advances the HW at the end
                                             "min.insync.replicas": "1"})
    wait_for(lambda: (s := c.state("compacted")) and s.leader == 1 and len(s.isr) == 3,
             what="compacted-0 led by 1 with a full ISR")
    p = producer(c.bootstrap)
    written: list[tuple[bytes, bytes]] = []
    for _ in range(4):
        written += burst(p, len(written), 500)
    c.kill(1)  # cleaning all along: segments of 4 KiB roll under a stream of ~130-byte records
    wait_for(lambda: (s := c.state("compacted")) and s.leader in (2, 3),
             what="a new leader after the kill")
    for _ in range(4):
        written += burst(p, len(written), 500)
    c.start(1)
    wait_for(lambda: (s := c.state("compacted")) and len(s.isr) == 3, timeout_s=120,
             what="broker 1 back in the ISR")
    written += burst(p, len(written), 200)
    wait_for(lambda: (s := c.state("compacted")) and len(s.isr) == 3, timeout_s=60,
             what="a full ISR after the last burst")
    # Leave broker 1 the only replica alive: it leads, and the consumer reads its log.
    c.kill(2)
    c.kill(3)
    wait_for(lambda: (s := c.state("compacted")) and s.leader == 1, timeout_s=60,
             what="broker 1 leading alone")
    latest = dict(written)
    port = next(b["port"] for b in json.loads((c.dir / "cluster.json").read_text())["brokers"]
                if b["id"] == 1)
    last_error: list[BaseException] = []

    def read_or_none() -> list[tuple[bytes | None, bytes | None, int]] | None:
        try:
            return read_from_the_beginning(port, "compacted")
        except (AssertionError, OSError) as exc:  # not serving it yet (leadership moving)
            last_error[:] = [exc]
            return None

    try:
        got = wait_for(read_or_none, timeout_s=60, what="broker 1 serving the topic")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last error: {last_error!r}") from None
    by_key: dict[bytes, bytes] = {}
    offsets = []
    for key, value, offset in got:
        assert key is not None and value is not None
        by_key[key] = value
        offsets.append(offset)
    assert by_key == latest
    assert offsets == sorted(set(offsets))
    assert len(got) < len(written) // 2, f"{len(got)} of {len(written)} records: not cleaned"
    c.start(2)
    c.start(3)
