"""Pipelined acks=all produce requests on one connection to a real replicated partition (what
librdkafka does at linger.ms=0): the leader appends each one as it arrives, while the earlier
ones still wait for the ISR, and the answers come back in request order."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import (
    ActingController,
    BrokerThread,
    broker_props,
    produce,
    produce_request,
    wait_until,
)
from zk_chroot import new_chroot

from tidelog.cluster.zookeeper import ZooKeeperServer
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.codec import decode_response, encode_request
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.records.builder import build_values
from tidelog.replication.types import TopicPartition

pytestmark = pytest.mark.integration

PRODUCE_VERSION = 9
TP = TopicPartition("pipe", 0)


@pytest.fixture
def pair(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[tuple[str, list[BrokerThread]]]:
    zk = new_chroot(zookeeper)
    extra = {"replica.lag.time.max.ms": 60_000, "min.insync.replicas": 2}
    brokers = [BrokerThread(broker_props(i, zk, tmp_path / f"b{i}", **extra)).start() for i in (1, 2)]
    try:
        yield zk, brokers
    finally:
        for b in brokers:
            b.stop()


def _read_frame(s: socket.socket) -> bytes:
    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf
    return exact(struct.unpack(">i", exact(4))[0])


def test_pipelined_acks_all_requests_are_appended_before_the_first_is_acknowledged(
    pair: tuple[str, list[BrokerThread]],
) -> None:
    zk, (b1, b2) = pair
    ctl = ActingController(zk, [b1, b2])
    fetchers = b2.server.replica_manager.fetcher_manager
    try:
        ctl.create_topic(TP.topic, {0: [1, 2]})
        assert produce(b1.port, TP.topic, 0, build_values([b"first"])) == (ErrorCode.NONE, 0)
        # The follower stops fetching (the leader still counts it in the ISR): no acks=all
        # request can complete until it fetches again.
        b2.call(fetchers.shutdown)
        s = socket.create_connection(("127.0.0.1", b1.port), timeout=30)
        try:
            s.sendall(b"".join(
                b"".join(bytes(x) for x in encode_request(
                    produce_request(TP.topic, 0, build_values([f"v{i}".encode()]),
                                    timeout_ms=30_000),
                    PRODUCE_VERSION, 100 + i))
                for i in range(3)))
            # All three are appended while the first still waits for the follower.
            wait_until(lambda: b1.partition(TP.topic, 0).log_end_offset == 4,
                       what="the three pipelined batches appended")
            assert b1.partition(TP.topic, 0).high_watermark == 1
            epoch = b1.partition(TP.topic, 0).leader_epoch
            b2.call(lambda: fetchers.add_fetcher_for_partitions({TP: (1, 1, epoch)}))
            answers = []
            for _ in range(3):
                corr = struct.unpack_from(">i", frame := _read_frame(s))[0]
                _, resp = decode_response(ApiKey.PRODUCE, PRODUCE_VERSION, frame)
                p = resp.responses[0].partition_responses[0]
                answers.append((corr, p.error_code, p.base_offset))
        finally:
            s.close()
        assert answers == [(100, 0, 1), (101, 0, 2), (102, 0, 3)]
        assert b1.partition(TP.topic, 0).high_watermark == 4
    finally:
        ctl.close()
