"""The producer: records batched per partition, idempotent by default.

Records go into per-partition batches (``batch.size``, ``linger.ms``). One sender task drains
the batches that are ready, groups them by partition leader and sends one ProduceRequest per
leader (split at ``max.request.size``), as Kafka's ``Sender`` does; requests to different
brokers, and successive requests to one broker, are in flight together over the pipelined
connections. Each partition has at most one batch in flight, so its order holds through
retries (Kafka allows five with sequence-ordered retries; one keeps the retry logic obviously
right). While a partition's batch is in flight the next one may grow to ``max.request.size``.

Idempotence (KIP-98): the producer takes a producer id and epoch from InitProducerId; a batch
gets its base sequence when it is first sent, and a retry resends the same bytes, so a batch
the broker already appended is recognised as a duplicate (answered with its offset, or
DUPLICATE_SEQUENCE_NUMBER, which is success). When a batch fails for good, later sequence
numbers of that partition would leave a gap (OUT_OF_ORDER_SEQUENCE_NUMBER), so the producer
takes a new producer id and restarts sequences at 0, as Kafka's producer resets its state.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from tidelog.client.cluster import KafkaClient
from tidelog.client.errors import (
    BrokerResponseError,
    KafkaClientError,
    KafkaConnectionError,
    RequestTimedOutError,
)
from tidelog.client.metadata import TopicPartition
from tidelog.client.partitioner import partition_for_key
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages.produce import (
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
)
from tidelog.protocol.records import Record, RecordBatch, build_batch
from tidelog.protocol.records.compression import CODECS_BY_NAME

__all__ = ["Producer", "parse_acks", "parse_compression"]

Header = tuple[str, bytes | None]

# Errors that end a batch and reset the producer id (the broker lost or fenced our state).
_RESET_PRODUCER_ERRORS = {
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
    ErrorCode.UNKNOWN_PRODUCER_ID,
    ErrorCode.INVALID_PRODUCER_EPOCH,
}
_RECORD_OVERHEAD = 24  # varints and attributes of one record, roughly


def parse_acks(acks: str | int) -> int:
    """ "all"/-1 -> -1, 1, 0 (Kafka's acks setting)."""
    text = str(acks).strip().lower()
    if text in ("all", "-1"):
        return -1
    if text in ("0", "1"):
        return int(text)
    raise ValueError(f"acks must be all, -1, 0 or 1, not {acks!r}")


def parse_compression(compression: str | int | None) -> int:
    """Kafka's compression.type names (none, gzip, snappy, lz4, zstd) or codec ids."""
    if compression is None:
        return 0
    if isinstance(compression, int):
        if compression not in CODECS_BY_NAME.values():
            raise ValueError(f"unknown compression codec {compression}")
        return compression
    codec = CODECS_BY_NAME.get(compression.strip().lower())
    if codec is None:
        names = ", ".join(CODECS_BY_NAME)
        raise ValueError(f"compression.type must be one of {names}, not {compression!r}")
    return codec


@dataclass(slots=True)
class _Batch:
    tp: TopicPartition
    created: float
    records: list[Record] = field(default_factory=list)
    futures: list[asyncio.Future[tuple[TopicPartition, int]]] = field(default_factory=list)
    size: int = 0
    closed: bool = False  # no more appends; built and sequenced
    data: bytes | bytearray | None = None
    attempts: int = 0
    last_error: int = 0
    # resolved (never failed) when the batch is acknowledged or failed: what flush() awaits
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class _PartitionQueue:
    __slots__ = ("tp", "batches", "in_flight", "retry_at")

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.batches: deque[_Batch] = deque()
        self.in_flight = False
        self.retry_at = 0.0  # monotonic time before which the head batch is not retried


class Producer:
    """An asyncio producer over a :class:`KafkaClient`. ``await start()`` (or ``async with``)."""

    def __init__(
        self,
        client: KafkaClient,
        *,
        acks: str | int = "all",
        enable_idempotence: bool = True,
        compression: str | int | None = "none",
        linger_ms: int = 5,
        batch_size: int = 16384,
        retries: int = 2147483647,
        delivery_timeout_ms: int = 120000,
        request_timeout_ms: int = 30000,
        retry_backoff_ms: int = 100,
        buffer_memory: int = 33554432,
        max_block_ms: int = 60000,
        max_request_size: int = 1048576,
        allow_auto_create_topics: bool = True,
    ) -> None:
        self.client = client
        # allow.auto.create.topics: a send to a missing topic asks the broker to create it
        self.allow_auto_create_topics = allow_auto_create_topics
        self.acks = parse_acks(acks)
        if enable_idempotence and self.acks != -1:
            # Kafka: "Must set acks to all in order to use the idempotent producer."
            raise ValueError("enable.idempotence requires acks=all")
        if linger_ms < 0 or batch_size <= 0 or delivery_timeout_ms <= 0:
            raise ValueError("linger.ms >= 0, batch.size > 0 and delivery.timeout.ms > 0")
        self.enable_idempotence = enable_idempotence
        self.compression = parse_compression(compression)
        self.linger_ms = linger_ms
        self.batch_size = batch_size
        self.retries = retries
        self.delivery_timeout_ms = delivery_timeout_ms
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.buffer_memory = buffer_memory
        self.max_block_ms = max_block_ms
        self.max_request_size = max_request_size
        self.producer_id = -1
        self.producer_epoch = -1
        self._next_sequence: dict[TopicPartition, int] = {}
        self._queues: dict[TopicPartition, _PartitionQueue] = {}
        self._sticky: dict[str, int] = {}
        self._buffered = 0
        self._space = asyncio.Event()
        self._flushing = 0
        self._closed = False
        self._started = False
        self._wakeup = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._requests: set[asyncio.Task[None]] = set()
        self._resetting: asyncio.Task[None] | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self._stale_topics: set[str] = set()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._started:
            return
        if self.enable_idempotence:
            self.producer_id, self.producer_epoch = await self.client.init_producer_id()
        self._started = True

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush what is buffered (up to ``timeout_s``), then stop the sender; records still
        unsent fail with KafkaConnectionError("producer closed")."""
        if self._closed:
            return
        try:
            if timeout_s is None:
                await self.flush()
            else:
                async with asyncio.timeout(timeout_s):
                    await self.flush()
        except TimeoutError:
            pass
        finally:
            self._closed = True
            tasks = [t for t in (self._sender, self._resetting, self._refreshing) if t]
            tasks += self._requests
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for q in self._queues.values():
                for batch in q.batches:
                    self._fail(batch, KafkaConnectionError("producer closed"))
                q.batches.clear()

    # -- sending --------------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Sequence[Header] = (),
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[tuple[TopicPartition, int]]:
        """Queue one record; the returned future resolves to (topic partition, offset) when
        it is acknowledged, or raises the error that failed it."""
        if self._closed:
            raise KafkaConnectionError("producer closed")
        if not self._started:
            await self.start()
        meta = self.client.metadata.topics.get(topic)
        if (
            meta is not None
            and not meta.error
            and meta.partitions
            and not self.client.metadata_stale
        ):
            partitions = sorted(meta.partitions) if partition is None else list(meta.partitions)
        else:
            partitions = await self.client.partitions_for(
                topic, allow_auto_topic_creation=self.allow_auto_create_topics
            )
        if partition is None:
            partition = self._choose_partition(topic, key, partitions)
        elif partition not in partitions:
            raise BrokerResponseError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} has no partition {partition}"
            )
        size = (
            _RECORD_OVERHEAD
            + (len(value) if value is not None else 0)
            + (len(key) if key is not None else 0)
            + sum(len(k) + (len(v) if v is not None else 0) for k, v in headers)
        )
        await self._reserve(size)
        tp = TopicPartition(topic, partition)
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        queue = self._queue(tp)
        batch = queue.batches[-1] if queue.batches else None
        # While a batch of this partition is in flight, the next one may grow past batch.size
        # up to max.request.size: one batch in flight per partition would otherwise cap
        # throughput at batch.size per round trip.
        limit = self.batch_size
        if batch is not None and len(queue.batches) == 2 and queue.in_flight:
            limit = max(self.batch_size, self.max_request_size)
        if batch is None or batch.closed or (batch.size + size > limit and batch.records):
            if batch is not None:
                if not batch.closed:
                    self._wakeup.set()  # the previous batch is full: send it now
                if key is None and partition == self._sticky.get(topic):
                    self._sticky.pop(topic, None)  # the next keyless record moves on
            batch = _Batch(tp, time.monotonic())
            queue.batches.append(batch)
        future: asyncio.Future[tuple[TopicPartition, int]] = (
            asyncio.get_running_loop().create_future()
        )
        batch.records.append(Record(value, key, tuple(headers), timestamp_ms))
        batch.futures.append(future)
        batch.size += size
        if batch.size >= limit or self.linger_ms == 0 or self._flushing:
            self._wakeup.set()
            # let the sender run: a caller looping over send() never suspends otherwise
            await asyncio.sleep(0)
        elif len(batch.records) == 1:
            self._wakeup.set()  # the sender schedules its linger deadline
        return future

    def _choose_partition(self, topic: str, key: bytes | None, partitions: list[int]) -> int:
        if key is not None:
            return partitions[partition_for_key(key, len(partitions))]
        # Sticky partitioning (KIP-480): fill one partition's batch before moving on.
        sticky = self._sticky.get(topic)
        if sticky is None or sticky not in partitions:
            sticky = random.choice(partitions)
            self._sticky[topic] = sticky
        return sticky

    async def _reserve(self, size: int) -> None:
        # buffer.memory: block the caller (up to max.block.ms) while too much is unsent
        deadline = time.monotonic() + self.max_block_ms / 1000
        while self._buffered + size > self.buffer_memory and self._buffered > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimedOutError(
                    f"buffer.memory {self.buffer_memory} full for max.block.ms {self.max_block_ms}"
                )
            self._space.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._space.wait()
            except TimeoutError:
                continue
        self._buffered += size

    def _release(self, size: int) -> None:
        self._buffered -= size
        self._space.set()

    def _queue(self, tp: TopicPartition) -> _PartitionQueue:
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = _PartitionQueue(tp)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(
                self._run_sender(), name="tidelog-producer-sender"
            )
        return queue

    async def flush(self) -> None:
        """Send everything buffered now and wait until each record is acknowledged or failed."""
        pending = [b.done for q in self._queues.values() for b in q.batches]
        if not pending:
            return
        self._flushing += 1
        try:
            self._wakeup.set()
            await asyncio.gather(*pending)
        finally:
            self._flushing -= 1

    # -- the sender -----------------------------------------------------------------------

    async def _run_sender(self) -> None:
        while not self._closed:
            self._wakeup.clear()
            try:
                next_wake = self._send_ready()
            except Exception as exc:  # noqa: BLE001 - a bug must fail records, not hang them
                for queue in self._queues.values():
                    while queue.batches and not queue.in_flight:
                        self._fail(queue.batches.popleft(), exc)
                continue
            timeout = None if next_wake is None else max(0.0, next_wake - time.monotonic())
            try:
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()
            except TimeoutError:
                pass

    def _send_ready(self) -> float | None:
        """Start a request per leader for the batches that are ready; return when the next
        one will be (linger or backoff), None if nothing is waiting for time to pass."""
        now = time.monotonic()
        next_wake: float | None = None

        def wake_at(when: float) -> None:
            nonlocal next_wake
            next_wake = when if next_wake is None else min(next_wake, when)

        ready: dict[int, list[_Batch]] = {}
        for queue in self._queues.values():
            if queue.in_flight or not queue.batches:
                continue
            batch = queue.batches[0]
            deadline = batch.created + self.delivery_timeout_ms / 1000
            if now >= deadline:
                queue.batches.popleft()
                self._fail(
                    batch,
                    BrokerResponseError(
                        batch.last_error or ErrorCode.REQUEST_TIMED_OUT,
                        f"{queue.tp}: delivery.timeout.ms {self.delivery_timeout_ms} expired",
                    ),
                )
                self._wakeup.set()
                continue
            if queue.retry_at > now:
                wake_at(queue.retry_at)
                continue
            linger_end = batch.created + self.linger_ms / 1000
            if not (
                batch.closed
                or len(queue.batches) > 1
                or batch.size >= self.batch_size
                or self._flushing
                or linger_end <= now
            ):
                wake_at(linger_end)
                continue
            if not batch.closed and self._resetting is not None:
                continue  # sequences restart once the new producer id is in
            leader = self.client.leader_for(queue.tp)
            if leader is None:
                self._stale_topics.add(queue.tp.topic)
                queue.retry_at = now + self.retry_backoff_ms / 1000
                wake_at(queue.retry_at)
                continue
            ready.setdefault(leader, []).append(batch)
        for leader, batches in ready.items():
            request: list[_Batch] = []
            size = 0
            for batch in batches:
                if not batch.closed:
                    self._close_batch(batch)
                assert batch.data is not None
                if request and size + len(batch.data) > self.max_request_size:
                    self._start_request(leader, request)
                    request, size = [], 0
                request.append(batch)
                size += len(batch.data)
            self._start_request(leader, request)
        if self._stale_topics and (self._refreshing is None or self._refreshing.done()):
            topics, self._stale_topics = sorted(self._stale_topics), set()
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh(topics))
        return next_wake

    async def _refresh(self, topics: list[str]) -> None:
        try:
            await self.client.refresh_metadata(
                topics, allow_auto_topic_creation=self.allow_auto_create_topics
            )
        except KafkaClientError:
            pass
        self._wakeup.set()

    def _start_request(self, leader: int, batches: list[_Batch]) -> None:
        for batch in batches:
            self._queues[batch.tp].in_flight = True
            batch.attempts += 1
        task = asyncio.get_running_loop().create_task(self._send_request(leader, batches))
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    async def _send_request(self, leader: int, batches: list[_Batch]) -> None:
        topics: dict[str, list[PartitionProduceData]] = {}
        for batch in batches:
            topics.setdefault(batch.tp.topic, []).append(
                PartitionProduceData(batch.tp.partition, batch.data)
            )
        request = ProduceRequest(
            transactional_id=None,
            acks=self.acks,
            timeout_ms=self.request_timeout_ms,
            topic_data=[TopicProduceData(t, parts) for t, parts in topics.items()],
        )
        results: dict[TopicPartition, tuple[int, int]] = {}
        default: int = ErrorCode.NONE
        try:
            if self.acks == 0:
                await self.client.send_no_response(leader, request)
            else:
                oldest = min(b.created for b in batches)
                remaining_ms = (oldest + self.delivery_timeout_ms / 1000 - time.monotonic()) * 1000
                response = await self.client.send(
                    leader,
                    request,
                    timeout_ms=max(1, min(self.request_timeout_ms, int(remaining_ms))),
                )
                default = ErrorCode.UNKNOWN_SERVER_ERROR  # a partition missing from the answer
                for topic in response.responses:
                    for part in topic.partition_responses:
                        results[TopicPartition(topic.name, part.index)] = (
                            part.error_code,
                            part.base_offset,
                        )
        except RequestTimedOutError:
            default = ErrorCode.REQUEST_TIMED_OUT
        except KafkaConnectionError:
            default = ErrorCode.NETWORK_EXCEPTION
        except KafkaClientError as exc:  # e.g. no Produce version in common: final
            for batch in batches:
                self._queues[batch.tp].in_flight = False
                self._finish(batch, exc)
            self._wakeup.set()
            return
        for batch in batches:
            code, base_offset = results.get(batch.tp, (default, -1))
            self._queues[batch.tp].in_flight = False
            self._handle_result(batch, code, base_offset)
        self._wakeup.set()

    def _handle_result(self, batch: _Batch, code: int, base_offset: int) -> None:
        queue = self._queues[batch.tp]
        if code in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
            self._finish(batch, None, base_offset if self.acks != 0 else -1)
            return
        batch.last_error = code
        now = time.monotonic()
        backoff = self.retry_backoff_ms * random.uniform(0.8, 1.2) / 1000
        if (
            _retriable(code)
            and batch.attempts <= self.retries
            and now + backoff < batch.created + self.delivery_timeout_ms / 1000
        ):
            queue.retry_at = now + backoff
            self._stale_topics.add(batch.tp.topic)
            return
        self._finish(
            batch, BrokerResponseError(code, f"{batch.tp} after {batch.attempts} attempt(s)")
        )
        if self.enable_idempotence and self.acks != 0:
            self._start_reset(batch)

    def _finish(self, batch: _Batch, error: BaseException | None, base_offset: int = -1) -> None:
        queue = self._queues[batch.tp]
        if queue.batches and queue.batches[0] is batch:
            queue.batches.popleft()
        queue.retry_at = 0.0
        if error is None:
            self._complete(batch, base_offset)
        else:
            self._fail(batch, error)

    def _close_batch(self, batch: _Batch) -> None:
        producer_id, epoch, base_sequence = -1, -1, -1
        if self.enable_idempotence:
            producer_id, epoch = self.producer_id, self.producer_epoch
            base_sequence = self._next_sequence.get(batch.tp, 0)
            # sequences wrap at int32 max (Kafka's DefaultRecordBatch.incrementSequence)
            self._next_sequence[batch.tp] = (base_sequence + len(batch.records)) & 0x7FFFFFFF
        batch.data = build_batch(
            batch.records,
            compression=self.compression,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=base_sequence,
        )
        batch.closed = True

    def _start_reset(self, failed: _Batch) -> None:
        # A lost batch leaves a sequence gap; a new producer id starts every partition at 0.
        if self._resetting is not None or _batch_producer_id(failed) != self.producer_id:
            return  # under way already, or the id already changed since this batch
        self._resetting = asyncio.get_running_loop().create_task(self._reset_producer_id())

    async def _reset_producer_id(self) -> None:
        try:
            for attempt in range(5):
                try:
                    self.producer_id, self.producer_epoch = await self.client.init_producer_id()
                    self._next_sequence.clear()
                    return
                except KafkaClientError:
                    await asyncio.sleep(self.retry_backoff_ms * (attempt + 1) / 1000)
            # no new id: keep the old one; its next batches fail and ask again
        finally:
            self._resetting = None
            self._wakeup.set()

    def _complete(self, batch: _Batch, base_offset: int) -> None:
        self._release(batch.size)
        batch.size = 0
        tp = batch.tp
        for i, future in enumerate(batch.futures):
            if not future.done():
                future.set_result((tp, base_offset + i if base_offset >= 0 else -1))
        if not batch.done.done():
            batch.done.set_result(None)

    def _fail(self, batch: _Batch, error: BaseException) -> None:
        if batch.size:
            self._release(batch.size)
            batch.size = 0
        for future in batch.futures:
            if not future.done():
                future.set_exception(error)
                # the error is the future's to report: no "never retrieved" log if the caller
                # fired and forgot
                future.exception()
        if not batch.done.done():
            batch.done.set_result(None)


def _batch_producer_id(batch: _Batch) -> int:
    return -1 if batch.data is None else RecordBatch(batch.data).producer_id


def _retriable(code: int) -> bool:
    if code in _RESET_PRODUCER_ERRORS:
        return False
    try:
        return ErrorCode(code).retriable
    except ValueError:
        return False
