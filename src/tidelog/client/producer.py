"""The producer: records batched per partition, idempotent by default.

Each partition has a queue of batches and one task that sends them, one batch in flight at a
time, so per-partition order holds through retries (Kafka keeps up to five in flight with
sequence-ordered retries; one keeps the retry logic obviously right). Different partitions are
sent concurrently over the pipelined broker connections.

Idempotence (KIP-98): the producer takes a producer id and epoch from InitProducerId; a batch
gets its base sequence when it is closed, and a retry resends the same bytes, so a batch the
broker already appended is recognised as a duplicate (answered with its offset, or
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

__all__ = ["Producer", "RecordMetadata", "parse_acks", "parse_compression"]

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


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where an acknowledged record went. offset is -1 for acks=0."""

    topic_partition: TopicPartition
    offset: int


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


class _PartitionQueue:
    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.batches: deque[_Batch] = deque()
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


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
    ) -> None:
        self.client = client
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
        self._incomplete: set[asyncio.Future[tuple[TopicPartition, int]]] = set()
        self._flushing = 0
        self._closed = False
        self._started = False
        self._reset_lock = asyncio.Lock()

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
        """Flush what is buffered (up to ``timeout_s``), then stop the partition tasks."""
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
            tasks = [q.task for q in self._queues.values() if q.task is not None]
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
        partitions = await self.client.partitions_for(topic)
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
        if batch is not None and len(queue.batches) == 2 and queue.batches[0].closed:
            limit = max(self.batch_size, self.max_request_size)
        if batch is None or batch.closed or (batch.size + size > limit and batch.records):
            if batch is not None:
                if not batch.closed:
                    queue.wakeup.set()  # the previous batch is full: send it now
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
        self._incomplete.add(future)
        future.add_done_callback(self._incomplete.discard)
        if batch.size >= limit or self.linger_ms == 0 or self._flushing:
            queue.wakeup.set()
            # let the sender run: a caller looping over send() never suspends otherwise
            await asyncio.sleep(0)
        elif len(batch.records) == 1:
            queue.wakeup.set()  # start its linger timer
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
        if queue.task is None or queue.task.done():
            queue.task = asyncio.get_running_loop().create_task(
                self._run_partition(queue), name=f"tidelog-producer-{tp}"
            )
        return queue

    async def flush(self) -> None:
        """Send everything buffered now and wait until each record is acknowledged or failed."""
        pending = list(self._incomplete)
        if not pending:
            return
        self._flushing += 1
        try:
            for queue in self._queues.values():
                queue.wakeup.set()
            await asyncio.gather(*pending, return_exceptions=True)
        finally:
            self._flushing -= 1

    # -- the per-partition sender ---------------------------------------------------------

    async def _run_partition(self, queue: _PartitionQueue) -> None:
        while True:
            if not queue.batches:
                queue.wakeup.clear()
                await queue.wakeup.wait()
                continue
            batch = queue.batches[0]
            if not batch.closed and not self._flushing and len(queue.batches) == 1:
                linger_left = batch.created + self.linger_ms / 1000 - time.monotonic()
                if batch.size < self.batch_size and linger_left > 0:
                    queue.wakeup.clear()
                    try:
                        async with asyncio.timeout(linger_left):
                            await queue.wakeup.wait()
                    except TimeoutError:
                        pass
                    continue
            try:
                await self._send_batch(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a bug must fail the records, not hang them
                self._fail(batch, exc)
            queue.batches.popleft()

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

    async def _send_batch(self, batch: _Batch) -> None:
        if not batch.closed:
            self._close_batch(batch)
        assert batch.data is not None
        tp = batch.tp
        request = ProduceRequest(
            transactional_id=None,
            acks=self.acks,
            timeout_ms=self.request_timeout_ms,
            topic_data=[
                TopicProduceData(tp.topic, [PartitionProduceData(tp.partition, batch.data)])
            ],
        )
        deadline = batch.created + self.delivery_timeout_ms / 1000
        while True:
            batch.attempts += 1
            code: int
            base_offset = -1
            try:
                leader = self.client.leader_for(tp)
                if leader is None:
                    await self.client.refresh_metadata([tp.topic])
                    leader = self.client.leader_for(tp)
                if leader is None:
                    code = ErrorCode.LEADER_NOT_AVAILABLE
                elif self.acks == 0:
                    await self.client.send_no_response(leader, request)
                    code = ErrorCode.NONE
                else:
                    remaining_ms = max(1, int((deadline - time.monotonic()) * 1000))
                    response = await self.client.send(
                        leader,
                        request,
                        timeout_ms=min(self.request_timeout_ms, remaining_ms),
                    )
                    part = response.responses[0].partition_responses[0]
                    code, base_offset = part.error_code, part.base_offset
            except RequestTimedOutError:
                code = ErrorCode.REQUEST_TIMED_OUT
            except KafkaConnectionError:
                code = ErrorCode.NETWORK_EXCEPTION
            except BrokerResponseError as exc:
                code = exc.code_value
            if code in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
                self._complete(batch, base_offset if self.acks != 0 else -1)
                return
            retriable = _retriable(code)
            if (
                not retriable
                or batch.attempts > self.retries
                or time.monotonic() + self.retry_backoff_ms / 1000 >= deadline
            ):
                error = BrokerResponseError(code, f"{tp} after {batch.attempts} attempt(s)")
                self._fail(batch, error)
                if self.enable_idempotence:
                    await self._reset_producer_id(batch)
                return
            await asyncio.sleep(self.retry_backoff_ms * random.uniform(0.8, 1.2) / 1000)
            try:
                await self.client.refresh_metadata([tp.topic])
            except KafkaClientError:
                pass

    async def _reset_producer_id(self, failed: _Batch) -> None:
        # A lost batch leaves a sequence gap; a new producer id starts every partition at 0.
        async with self._reset_lock:
            if self.producer_id != _batch_producer_id(failed):
                return  # another partition already reset it
            try:
                self.producer_id, self.producer_epoch = await self.client.init_producer_id()
            except KafkaClientError:
                return  # keep the old id; later batches fail and retry the reset
            self._next_sequence.clear()
            # Batches already sequenced under the old id stay valid for it; queued batches
            # that are not closed yet get new sequences when they are.

    def _complete(self, batch: _Batch, base_offset: int) -> None:
        self._release(batch.size)
        batch.size = 0
        for i, future in enumerate(batch.futures):
            if not future.done():
                offset = base_offset + i if base_offset >= 0 else -1
                future.set_result((batch.tp, offset))

    def _fail(self, batch: _Batch, error: BaseException) -> None:
        if batch.size:
            self._release(batch.size)
            batch.size = 0
        for future in batch.futures:
            if not future.done():
                future.set_exception(error)


def _batch_producer_id(batch: _Batch) -> int:
    return -1 if batch.data is None else RecordBatch(batch.data).producer_id


def _retriable(code: int) -> bool:
    if code in _RESET_PRODUCER_ERRORS:
        return False
    try:
        return ErrorCode(code).retriable
    except ValueError:
        return False
