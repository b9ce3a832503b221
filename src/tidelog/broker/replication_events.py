"""Replication telemetry: a broker's ISR changes, elections and HW checkpoints as records.

A tidelog extension (Kafka has no such topic). With ``tidelog.replication.events.enable=true``
each broker appends a JSON event to the internal topic ``__replication_events`` for

- ``isr_shrink`` / ``isr_expand``: an ISR change this broker (the leader) wrote, once the
  ZooKeeper compare-and-set succeeded (a refused CAS changed nothing);
- ``leader_election``: this broker became the partition's leader in a new leader epoch;
- ``hw_checkpoint``: at a ``highwatermark-checkpoint`` run, one event per partition hosted here
  whose high watermark moved since the previous run.

Event: ``{"type", "topic", "partition", "broker", "leader_epoch", "old_isr", "new_isr",
"leo", "hw", "time_ms"}`` (keyed by ``topic-partition``; ``old_isr == new_isr`` for elections and
checkpoints).

Telemetry must never slow down or fail replication: the hooks only ``put_nowait`` into a bounded
queue (a full queue drops the event, counted in ``dropped`` and logged); one task drains it
through tidelog's own producer (acks=1, not idempotent). A failed send is a drop too. The
topic is created on first use when missing (replication factor min(3, live brokers), one
partition), through the ZooKeeper admin path as Kafka's ``AdminZkClient`` does, when the first
event is to be sent (in a new cluster that is the first topic's creation, all brokers up). Events about the
events topic's own HW are not published: each would move that HW again (a feedback loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "EVENTS_TOPIC",
    "EVENT_TYPES",
    "ReplicationEvent",
    "ReplicationEventPublisher",
    "read_events",
]

logger = logging.getLogger(__name__)

EVENTS_TOPIC = "__replication_events"
EVENT_TYPES = ("isr_shrink", "isr_expand", "leader_election", "hw_checkpoint")
_LOG_DROPS_EVERY_S = 10.0


@dataclass(frozen=True, slots=True)
class ReplicationEvent:
    type: str
    topic: str
    partition: int
    broker: int
    leader_epoch: int
    old_isr: list[int]
    new_isr: list[int]
    leo: int
    hw: int
    time_ms: int

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> ReplicationEvent:
        d = json.loads(data)
        return cls(str(d["type"]), str(d["topic"]), int(d["partition"]), int(d["broker"]),
                   int(d["leader_epoch"]), [int(b) for b in d["old_isr"]],
                   [int(b) for b in d["new_isr"]], int(d["leo"]), int(d["hw"]),
                   int(d["time_ms"]))


class ReplicationEventPublisher:
    """One per broker. Hooks (`isr_changed`, `leader_elected`, `hw_checkpoint`) are called on
    the broker's event loop and never block; `start()` / `shutdown()` run the sender task.

    ``bootstrap`` returns the servers the producer connects to (the broker itself, once bound);
    ``create_topic(replication_factor)`` creates the events topic (run in a thread; raising
    "already exists" is fine) and ``live_brokers()`` counts the registered brokers.
    """

    def __init__(
        self,
        broker_id: int,
        bootstrap: Callable[[], str],
        *,
        create_topic: Callable[[int], Any] | None = None,
        live_brokers: Callable[[], int] | None = None,
        queue_capacity: int = 10_000,
        topic: str = EVENTS_TOPIC,
    ) -> None:
        if queue_capacity < 1:
            raise ValueError("queue_capacity must be >= 1")
        self.broker_id = broker_id
        self.topic = topic
        self._bootstrap = bootstrap
        self._create_topic = create_topic
        self._live_brokers = live_brokers
        self._queue: asyncio.Queue[ReplicationEvent] = asyncio.Queue(queue_capacity)
        self._task: asyncio.Task[None] | None = None
        self._hw_at_last_checkpoint: dict[tuple[str, int], int] = {}
        self.published = 0
        self.dropped = 0
        self._last_drop_log = 0.0

    # ------------------------------------------------------------------ hooks
    def isr_changed(self, topic: str, partition: int, leader_epoch: int,
                    old_isr: Iterable[int], new_isr: Iterable[int], leo: int, hw: int) -> None:
        old, new = sorted(old_isr), sorted(new_isr)
        if old == new:
            return
        kind = "isr_shrink" if len(new) < len(old) else "isr_expand"
        self._offer(ReplicationEvent(kind, topic, partition, self.broker_id, leader_epoch,
                                     old, new, leo, hw, _now_ms()))

    def leader_elected(self, topic: str, partition: int, leader_epoch: int, isr: Iterable[int],
                       leo: int, hw: int) -> None:
        members = sorted(isr)
        self._offer(ReplicationEvent("leader_election", topic, partition, self.broker_id,
                                     leader_epoch, members, members, leo, hw, _now_ms()))

    def hw_checkpoint(self, partitions: Iterable[tuple[str, int, int, Iterable[int], int, int]]
                      ) -> None:
        """``partitions``: (topic, partition, leader_epoch, isr, leo, hw) of every hosted
        partition; an event for each whose HW moved since the previous call."""
        now = _now_ms()
        seen: set[tuple[str, int]] = set()
        for topic, partition, epoch, isr, leo, hw in partitions:
            key = (topic, partition)
            seen.add(key)
            if topic == self.topic or self._hw_at_last_checkpoint.get(key) == hw:
                continue
            self._hw_at_last_checkpoint[key] = hw
            members = sorted(isr)
            self._offer(ReplicationEvent("hw_checkpoint", topic, partition, self.broker_id,
                                         epoch, members, members, leo, hw, now))
        for key in set(self._hw_at_last_checkpoint) - seen:
            del self._hw_at_last_checkpoint[key]

    def _offer(self, event: ReplicationEvent) -> None:
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self._drop(1, "queue full")

    def _drop(self, n: int, why: str) -> None:
        self.dropped += n
        now = time.monotonic()
        if now - self._last_drop_log >= _LOG_DROPS_EVERY_S:
            self._last_drop_log = now
            logger.warning("broker %d: dropped replication events (%s); %d dropped so far",
                           self.broker_id, why, self.dropped)

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    # ------------------------------------------------------------------ sender
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="replication-events")

    async def shutdown(self, timeout_s: float = 2.0) -> None:
        """Give queued events ``timeout_s`` to go out, then stop (what is left is dropped)."""
        if self._task is None:
            return
        deadline = time.monotonic() + timeout_s
        while self._queue.qsize() and time.monotonic() < deadline and not self._task.done():
            await asyncio.sleep(0.05)
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task
        self._task = None
        left = 0
        while not self._queue.empty():
            self._queue.get_nowait()
            left += 1
        if left:
            self._drop(left, "shutdown")

    async def _run(self) -> None:
        from tidelog.client.cluster import KafkaClient
        from tidelog.client.producer import Producer

        first: ReplicationEvent | None = None
        try:
            while True:  # one client per attempt: a broken client is rebuilt after a pause
                if first is None:
                    # Connect (and create the topic) only once there is something to say: a
                    # new cluster's first event comes with its first topic, all brokers up.
                    first = await self._queue.get()
                client = KafkaClient(self._bootstrap(),
                                     client_id=f"replication-events-{self.broker_id}",
                                     request_timeout_ms=10_000, retries=3)
                try:
                    await client.start()
                    await self._ensure_topic(client)
                    producer = Producer(client, acks=1, enable_idempotence=False, linger_ms=50,
                                        delivery_timeout_ms=30_000, request_timeout_ms=10_000)
                    await producer.start()
                    try:
                        event, first = first, None
                        await self._send(producer, event)
                        await self._drain(producer)
                    finally:
                        await producer.close(timeout_s=1.0)
                except Exception as e:
                    logger.warning("broker %d: replication events sender failed (%s); retrying",
                                   self.broker_id, e)
                finally:
                    with contextlib.suppress(Exception):
                        await client.close()
                await asyncio.sleep(1.0)
        except asyncio.CancelledError:
            if first is not None:  # taken from the queue, never handed to the producer
                self._drop(1, "shutdown")
            raise

    async def _ensure_topic(self, client: Any) -> None:
        try:
            await client.partitions_for(self.topic, refresh=True)
            return
        except Exception:
            pass
        if self._create_topic is not None:
            live = self._live_brokers() if self._live_brokers is not None else 1
            rf = max(1, min(3, live))
            try:
                await asyncio.to_thread(self._create_topic, rf)
                logger.info("created %s (replication factor %d)", self.topic, rf)
            except Exception as e:  # another broker created it first, typically
                logger.info("creating %s: %s", self.topic, e)
        for _ in range(100):  # the controller elects its leader shortly (bounded: ~10 s)
            try:
                await client.partitions_for(self.topic, refresh=True)
                if client.leader_for(_tp(self.topic)) is not None:
                    return
            except Exception:
                pass
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.topic} has no leader yet")

    async def _drain(self, producer: Any) -> None:
        while True:
            await self._send(producer, await self._queue.get())

    async def _send(self, producer: Any, event: ReplicationEvent) -> None:
        key = f"{event.topic}-{event.partition}".encode()
        try:
            fut = await producer.send(self.topic, event.to_json(), key=key, partition=0)
        except Exception:
            self._drop(1, "send failed")
            raise
        fut.add_done_callback(self._on_sent)

    def _on_sent(self, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self._drop(1, "send failed" if not fut.cancelled() else "cancelled")
        else:
            self.published += 1


async def read_events(bootstrap_servers: str, *, topic: str = EVENTS_TOPIC,
                      timeout_s: float = 30.0) -> list[ReplicationEvent]:
    """Every event in ``topic`` up to its high watermark now, read with tidelog's consumer
    (bounded by ``timeout_s``; raises TimeoutError when the end is not reached in time)."""
    from tidelog.client.cluster import KafkaClient
    from tidelog.client.consumer import Consumer
    from tidelog.client.metadata import TopicPartition

    tp = TopicPartition(topic, 0)
    out: list[ReplicationEvent] = []
    async with KafkaClient(bootstrap_servers, client_id="replication-events-reader") as client:
        end = (await client.list_offsets({tp: -1}))[tp].offset  # LATEST: the HW
        consumer = Consumer(client, auto_offset_reset="earliest")
        consumer.assign([(tp, 0)])
        try:
            async with asyncio.timeout(timeout_s):
                while (consumer.position(tp) or 0) < end:
                    for rec in await consumer.poll(timeout_ms=500):
                        if rec.offset < end and rec.value is not None:
                            out.append(ReplicationEvent.from_json(rec.value))
        finally:
            await consumer.close()
    return out


def _tp(topic: str) -> Any:
    from tidelog.client.metadata import TopicPartition

    return TopicPartition(topic, 0)


def _now_ms() -> int:
    return int(time.time() * 1000)
