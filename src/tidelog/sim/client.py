"""Simulated clients: producers (acks=all / acks=1) and consumers that record what was acked
and what was read.

Every produced batch holds one record with a unique value, so its CRC32C (which covers neither
the base offset nor the partition leader epoch the leader stamps) identifies it in any replica's
log. A producer records `acked[crc] = offset`; a consumer records `(offset, crc)` for every batch
it reads. The end-of-run checks compare both with the replicas' logs (NoAckedLoss; consumed data
never changes). Clients find leaders as a metadata request would: from the partition state in
(simulated) ZooKeeper. They never retry a failed produce: an unacked write may or may not be in
the log, and that is allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tidelog.protocol.records.batch import iter_batches
from tidelog.protocol.records.builder import build_values
from tidelog.replication.types import TopicPartition
from tidelog.sim.clock import Scheduler, Timer
from tidelog.sim.messages import (
    ConsumerFetchRequest,
    ConsumerFetchResponse,
    ProduceRequest,
    ProduceResponse,
)
from tidelog.sim.network import Network

LeaderLookup = Callable[[TopicPartition], tuple[int, int]]  # -> (leader, leader epoch)


@dataclass(slots=True)
class ClientStats:
    sent: int = 0
    acked: int = 0
    errors: int = 0
    timeouts: int = 0
    fetched_batches: int = 0


class Producer:
    def __init__(self, node_id: int, tp: TopicPartition, acks: int, scheduler: Scheduler,
                 network: Network, leader_of: LeaderLookup, *, timeout_ms: int = 1500) -> None:
        self.node_id = node_id
        self.tp = tp
        self.acks = acks
        self.scheduler = scheduler
        self.network = network
        self.leader_of = leader_of
        self.timeout_ms = timeout_ms
        self._corr = 0
        self._inflight: dict[int, tuple[int, int, Timer]] = {}  # corr -> (crc, sent at, timer)
        self.acked: dict[int, int] = {}  # batch crc -> offset (acks as configured)
        self.acked_at: dict[int, int] = {}  # batch crc -> virtual time of the ack
        self.error_codes: list[int] = []  # the error code of every refused produce, in order
        self.stats = ClientStats()
        self.on_ack: Callable[[Producer, int, int], None] | None = None
        network.register(node_id, self.receive)

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    def produce(self, count: int = 1) -> None:
        leader, _ = self.leader_of(self.tp)
        for _ in range(count):
            self._corr += 1
            corr = self._corr
            value = b"c%d-%d" % (self.node_id, corr)
            batch = bytes(build_values([value], now_ms=self.scheduler.now_ms))
            crc = int.from_bytes(batch[17:21], "big")
            self.stats.sent += 1
            if leader < 0:
                self.stats.errors += 1
                continue
            timer = self.scheduler.schedule(self.timeout_ms + 200, self._timed_out, corr)
            self._inflight[corr] = (crc, self.scheduler.now_ms, timer)
            self.network.send(self.node_id, leader, ProduceRequest(
                corr, self.acks, self.timeout_ms, self.tp, batch))

    def _timed_out(self, corr: int) -> None:
        if self._inflight.pop(corr, None) is not None:
            self.stats.timeouts += 1

    def receive(self, src: int, msg: object) -> None:
        if not isinstance(msg, ProduceResponse):
            return
        entry = self._inflight.pop(msg.corr_id, None)
        if entry is None:
            return  # timed out already, or a duplicate
        crc, _, timer = entry
        timer.cancel()
        if msg.error == 0:
            self.acked[crc] = msg.base_offset
            self.acked_at[crc] = self.scheduler.now_ms
            self.stats.acked += 1
            if self.on_ack is not None:
                self.on_ack(self, crc, msg.base_offset)
        else:
            self.stats.errors += 1
            self.error_codes.append(msg.error)


class Consumer:
    """Fetches from the leader at its position, forever, recording (offset, crc) of each batch."""

    def __init__(self, node_id: int, tp: TopicPartition, scheduler: Scheduler, network: Network,
                 leader_of: LeaderLookup, *, poll_interval_ms: int = 20,
                 max_wait_ms: int = 50) -> None:
        self.node_id = node_id
        self.tp = tp
        self.scheduler = scheduler
        self.network = network
        self.leader_of = leader_of
        self.poll_interval_ms = poll_interval_ms
        self.max_wait_ms = max_wait_ms
        self.position = 0
        self.consumed: dict[int, int] = {}  # offset -> crc
        self.max_hw_seen = 0
        self.hw_regressions = 0  # HW lower than one seen before (across leader changes)
        self.offset_violations: list[tuple[int, int]] = []  # (previous position, offset read)
        self._corr = 0
        self._waiting: int | None = None
        self._deadline: Timer | None = None
        self.stats = ClientStats()
        self.running = False
        network.register(node_id, self.receive)

    def start(self) -> None:
        if not self.running:
            self.running = True
            self.scheduler.schedule(self.poll_interval_ms, self._poll)

    def _poll(self) -> None:
        if not self.running:
            return
        leader, epoch = self.leader_of(self.tp)
        self._corr += 1
        self._waiting = self._corr
        if leader >= 0:
            self.network.send(self.node_id, leader, ConsumerFetchRequest(
                self._corr, self.tp, self.position, epoch, self.max_wait_ms))
        # Whatever happens to the request, poll again after a bounded wait.
        self._deadline = self.scheduler.schedule(self.max_wait_ms + 100, self._expire, self._corr)

    def _expire(self, corr: int) -> None:
        if self._waiting == corr:
            self._waiting = None
            self.stats.timeouts += 1
            self._poll()

    def receive(self, src: int, msg: object) -> None:
        if not isinstance(msg, ConsumerFetchResponse) or msg.corr_id != self._waiting:
            return
        self._waiting = None
        if self._deadline is not None:
            self._deadline.cancel()
        if msg.error == 0:
            if msg.high_watermark < self.max_hw_seen:
                self.hw_regressions += 1
            self.max_hw_seen = max(self.max_hw_seen, msg.high_watermark)
            for batch in iter_batches(msg.records):
                off = batch.base_offset
                if off < self.position and batch.last_offset < self.position:
                    continue  # the batch we asked from the middle of is delivered whole
                if off < self.position:
                    pass
                elif off != self.position:
                    self.offset_violations.append((self.position, off))
                self.consumed[off] = batch.crc
                self.position = batch.last_offset + 1
                self.stats.fetched_batches += 1
        else:
            self.stats.errors += 1
        self.scheduler.schedule(self.poll_interval_ms if msg.error else 1, self._poll)


@dataclass(slots=True)
class ClientSet:
    producers: list[Producer] = field(default_factory=list)
    consumers: list[Consumer] = field(default_factory=list)
