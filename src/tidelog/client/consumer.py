"""An assign-based consumer: the caller chooses partitions and offsets (no group yet).

``poll`` fetches every assigned partition from its leader (one Fetch per broker, concurrently),
decodes the record batches, and returns records in offset order per partition. Positions that
need a reset (``seek_to_beginning``/``seek_to_end``, no offset given, or OFFSET_OUT_OF_RANGE
under ``auto.offset.reset``) are resolved with ListOffsets first. Leader changes
(NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, broken connections) refresh the metadata and the
next fetch goes to the new leader.

Fetching from the closest replica (KIP-392), as Kafka's Java consumer: the consumer sends its
``client_rack`` (``client.rack``) with each Fetch; a leader whose ``replica.selector.class``
names a follower answers with ``preferred_read_replica``, and the consumer fetches that partition
from the follower until ``metadata.max.age.ms`` passes, the follower leaves the metadata, the
metadata names a new leader or leader epoch (``SubscriptionState.maybeValidatePosition``), or a
fetch from it fails (``FetchCollector.handleInitializeErrors``: an error that asks for new
metadata, OFFSET_OUT_OF_RANGE, or a lost connection): then from the leader again, which may
name the follower again. UNKNOWN_LEADER_EPOCH (the replica has not heard of the epoch yet) and
UNKNOWN_SERVER_ERROR keep it: the partition is fetched again from the same replica, with no new
metadata, as the Java consumer (which only logs them).

Fetch sessions (KIP-227), as Kafka's Java consumer: one session per leader
(``FetchSessionHandler``, shared with the replica fetchers). The first fetch to a leader is full
(epoch 0) and opens a session; the next ones are incremental, listing only partitions whose fetch
position changed or that were added, and forgetting those no longer fetched (a partition with
records still buffered is not fetched, as in Kafka). FETCH_SESSION_ID_NOT_FOUND starts over with
a new session; INVALID_FETCH_SESSION_EPOCH, a response that does not fit the session, or a lost
request make the next fetch full again (closing the session); the partitions of such a response
are not used. ``close`` closes the sessions (epoch -1).

Log truncation (KIP-320), as Kafka's Java consumer: each position keeps the leader epoch of the
last batch consumed (none when that batch has none, after a seek or a reset by ListOffsets).
When the metadata shows a newer leader epoch for the partition, the position is validated
before its next fetch:
OffsetsForLeaderEpoch(that epoch) at the leader — one request per leader for all its partitions
to validate, sent together (``OffsetFetcher.validatePositionsAsync``) — then
``SubscriptionState.maybeCompleteValidation``:
an end offset below the position means the log was truncated there (an unclean election), and
the position moves back to it, or with ``auto.offset.reset=none`` ``poll`` raises
``LogTruncationError`` (the position is then not fetched from until a seek, and validated and
raised again once ``request.timeout.ms`` has passed); an epoch the leader cannot place resets
the position per ``auto.offset.reset``. Like the Java consumer
(``AbstractFetch.prepareFetchRequests``), fetches carry no last fetched epoch, so no
DivergingEpoch comes back to a consumer.

Consumer groups can be layered on later: they only decide ``assign`` and commit ``position``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from tidelog.client.cluster import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    FetchResult,
    KafkaClient,
)
from tidelog.client.errors import (
    BrokerResponseError,
    KafkaClientError,
    KafkaConnectionError,
    RequestTimedOutError,
)
from tidelog.client.metadata import PartitionMetadata, TopicPartition
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages.offset_for_leader_epoch import (
    EpochEndOffset,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from tidelog.protocol.records import CorruptRecordError, decode_records, iter_batches
from tidelog.replication.errors import Errors
from tidelog.replication.fetcher import FetchPartition, FetchResponseData, FetchSessionHandler

__all__ = [
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "Consumer",
    "ConsumerRecord",
    "LogTruncationError",
    "OffsetOutOfRangeError",
]

# Logical offsets accepted by assign() and seek() (librdkafka's RD_KAFKA_OFFSET_BEGINNING/END).
OFFSET_BEGINNING = -2
OFFSET_END = -1

_LEADER_ERRORS = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.REPLICA_NOT_AVAILABLE,
    ErrorCode.KAFKA_STORAGE_ERROR,
    ErrorCode.OFFSET_NOT_AVAILABLE,
    ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.REQUEST_TIMED_OUT,
}
# Fetch errors Kafka's FetchCollector only logs: the partition is fetched again from the same
# replica (a preferred read replica kept), with no metadata update.
_FETCH_AGAIN = {ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.UNKNOWN_SERVER_ERROR}


class OffsetOutOfRangeError(BrokerResponseError):
    """OFFSET_OUT_OF_RANGE with ``auto.offset.reset=none``."""

    def __init__(self, tp: TopicPartition, offset: int) -> None:
        super().__init__(ErrorCode.OFFSET_OUT_OF_RANGE, f"{tp} offset {offset}")
        self.topic_partition = tp
        self.offset = offset


class LogTruncationError(OffsetOutOfRangeError):
    """The log was truncated below the position (Kafka's LogTruncationException), with
    ``auto.offset.reset=none``. ``truncations``: each partition one leader's answer found
    truncated, with (its position, the divergent offset: (the first offset known to diverge,
    its leader epoch), None when the leader could not place the position's epoch);
    ``topic_partition``, ``offset`` and ``divergent_offset`` are the first one's."""

    def __init__(
        self, truncations: dict[TopicPartition, tuple[int, tuple[int, int] | None]]
    ) -> None:
        tp, (offset, divergent_offset) = next(iter(truncations.items()))
        super().__init__(tp, offset)
        self.divergent_offset = divergent_offset
        self.truncations = truncations


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


class Consumer:
    """Reads assigned partitions. ``auto_offset_reset``: earliest, latest or none."""

    def __init__(
        self,
        client: KafkaClient,
        *,
        auto_offset_reset: str = "latest",
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        fetch_max_bytes: int = 52428800,
        max_partition_fetch_bytes: int = 1048576,
        check_crcs: bool = True,
        client_rack: str = "",
    ) -> None:
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(
                f"auto.offset.reset must be earliest, latest or none, not {auto_offset_reset!r}"
            )
        self.client = client
        self.auto_offset_reset = auto_offset_reset
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.check_crcs = check_crcs
        self.client_rack = client_rack
        # next offset to return per partition; None: to be reset, with the wanted timestamp
        self._position: dict[TopicPartition, int] = {}
        self._reset: dict[TopicPartition, int] = {}
        self._buffer: dict[TopicPartition, deque[ConsumerRecord]] = {}
        self._high_watermark: dict[TopicPartition, int] = {}
        # KIP-320 (Kafka's FetchPosition): the leader epoch of the record before the position
        # (offsetEpoch) and the leader epoch the position was last validated under.
        self._offset_epoch: dict[TopicPartition, int] = {}
        self._leader_epoch: dict[TopicPartition, int] = {}
        # Positions found truncated with auto.offset.reset=none: awaiting validation, neither
        # fetched nor validated again under the same leader epoch before this monotonic time
        # (Kafka's nextRetryTimeMs: the validation's send time + request.timeout.ms), unless
        # sought: (that time, the leader epoch validated under).
        self._validate_after: dict[TopicPartition, tuple[float, int]] = {}
        self._closed = False
        # KIP-227: the fetch session with each broker fetched from (broker id -> its handler)
        self._sessions: dict[int, FetchSessionHandler] = {}
        # KIP-392: the replica a leader named for a partition, until a monotonic time
        self._preferred: dict[TopicPartition, tuple[int, float]] = {}

    # -- assignment and positions ---------------------------------------------------------

    def assign(
        self, partitions: Iterable[TopicPartition | tuple[TopicPartition, int | None]]
    ) -> None:
        """Replace the assignment. Each entry is a partition (position from
        ``auto.offset.reset``) or (partition, offset) with an offset >= 0, OFFSET_BEGINNING or
        OFFSET_END."""
        self._position.clear()
        self._reset.clear()
        self._buffer.clear()
        self._high_watermark.clear()
        self._preferred.clear()
        self._offset_epoch.clear()
        self._leader_epoch.clear()
        self._validate_after.clear()
        for entry in partitions:
            if isinstance(entry, TopicPartition):
                tp, offset = entry, None
            else:
                tp, offset = TopicPartition(*entry[0]), entry[1]
            self._set(tp, offset)

    def assignment(self) -> set[TopicPartition]:
        return set(self._position) | set(self._reset)

    def _set(self, tp: TopicPartition, offset: int | None) -> None:
        self._buffer.pop(tp, None)
        self._position.pop(tp, None)
        self._reset.pop(tp, None)
        self._offset_epoch.pop(tp, None)  # a sought position has no epoch: never validated
        self._validate_after.pop(tp, None)
        if offset is None:
            if self.auto_offset_reset == "none":
                raise ValueError(f"{tp}: no offset given and auto.offset.reset is none")
            offset = OFFSET_BEGINNING if self.auto_offset_reset == "earliest" else OFFSET_END
        if offset == OFFSET_BEGINNING:
            self._reset[tp] = EARLIEST_TIMESTAMP
        elif offset == OFFSET_END:
            self._reset[tp] = LATEST_TIMESTAMP
        elif offset >= 0:
            self._position[tp] = offset
        else:
            raise ValueError(f"{tp}: invalid offset {offset}")

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` next (OFFSET_BEGINNING / OFFSET_END also accepted)."""
        if tp not in self.assignment():
            raise ValueError(f"{tp} is not assigned")
        self._set(tp, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self.assignment()):
            self.seek(tp, OFFSET_BEGINNING)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self.assignment()):
            self.seek(tp, OFFSET_END)

    def position(self, tp: TopicPartition) -> int | None:
        """The offset of the next record ``poll`` returns for ``tp`` (None until reset)."""
        buffered = self._buffer.get(tp)
        if buffered:
            return buffered[0].offset
        return self._position.get(tp)

    def high_watermark(self, tp: TopicPartition) -> int | None:
        """The high watermark seen in the last fetch of ``tp``."""
        return self._high_watermark.get(tp)

    async def close(self) -> None:
        self._closed = True
        self.assign([])
        # As Kafka's consumer: tell each leader its session is over (epoch -1), best effort.
        sessions, self._sessions = self._sessions, {}
        await asyncio.gather(
            *(self.client.fetch_from(leader, {}, session_id=s.session_id, max_wait_ms=0,
                                     min_bytes=0)
              for leader, s in sessions.items() if s.session_id),
            return_exceptions=True)

    # -- polling --------------------------------------------------------------------------

    async def poll(self, max_records: int = 500, timeout_ms: int = 1000) -> list[ConsumerRecord]:
        """Up to ``max_records`` records, waiting at most about ``timeout_ms`` for some."""
        if self._closed:
            raise KafkaConnectionError("consumer closed")
        if max_records <= 0:
            raise ValueError("max_records must be positive")
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            if self._reset:
                await self._reset_positions()
            records = self._drain(max_records)
            if records:
                return records
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not self._position:
                return []
            await self._fetch_once(min(self.fetch_max_wait_ms, remaining_ms))

    def _drain(self, max_records: int) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        for buffered in self._buffer.values():
            while buffered and len(out) < max_records:
                out.append(buffered.popleft())
            if len(out) >= max_records:
                break
        return out

    async def _reset_positions(self) -> None:
        wanted = dict(self._reset)
        results = await self.client.list_offsets(wanted)
        for tp, result in results.items():
            if self._reset.get(tp) != wanted[tp]:
                continue  # sought again meanwhile
            if result.error == ErrorCode.NONE and result.offset >= 0:
                del self._reset[tp]
                self._position[tp] = result.offset
                # No offset epoch, as Kafka's resetPositionIfNeeded ("This will ensure we skip
                # validation"): a reset position is not validated at the next leader change.
                self._offset_epoch.pop(tp, None)
            elif not _retriable(result.error):
                raise BrokerResponseError(result.error, f"ListOffsets for {tp}")

    async def _validate_positions(
        self, wanted: dict[TopicPartition, tuple[int, PartitionMetadata]]
    ) -> tuple[list[TopicPartition], list[TopicPartition]]:
        """Kafka's validatePositionsAsync + maybeCompleteValidation for the positions whose
        leader epoch the metadata moved past: one OffsetsForLeaderEpoch per leader for all of
        its partitions, the leaders asked together (regroupFetchPositionsByLeader). Returns the
        partitions that may be fetched at their position now, and those to validate again at a
        later poll, after new metadata (Kafka's partitionsToRetry and a failed request's
        requestFailed). One attempt each: the client's retries would hold poll past its
        timeout, each with the leader epoch of the metadata it started with."""
        by_leader: dict[int, dict[TopicPartition, tuple[int, PartitionMetadata]]] = {}
        for tp, (offset, part) in wanted.items():
            by_leader.setdefault(part.leader, {})[tp] = (offset, part)
        leaders = list(by_leader)
        retry_at = time.monotonic() + self.client.request_timeout_ms / 1000
        answers = await asyncio.gather(
            *(self._end_offsets(node, by_leader[node]) for node in leaders),
            return_exceptions=True,
        )
        validated: list[TopicPartition] = []
        retry: list[TopicPartition] = []
        truncations: dict[TopicPartition, tuple[int, tuple[int, int] | None]] = {}
        for node, answer in zip(leaders, answers, strict=True):
            asked = by_leader[node]
            if isinstance(answer, BaseException):
                if isinstance(answer, KafkaClientError) and answer.retriable:
                    retry += asked
                    continue
                raise answer
            found: dict[TopicPartition, tuple[int, tuple[int, int] | None]] = {}
            for tp, (offset, part) in asked.items():
                if self._position.get(tp) != offset:
                    continue  # sought meanwhile
                end = answer.get(tp)
                if end is None or end.error_code != ErrorCode.NONE:
                    # Kafka's OffsetsForLeaderEpochUtils.handleResponse: only a topic
                    # authorization failure is raised; any other error, or no answer for the
                    # partition, is retried (partitionsToRetry).
                    if end is not None and end.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
                        raise BrokerResponseError(end.error_code, f"OffsetsForLeaderEpoch for {tp}")
                    retry.append(tp)
                    continue
                unplaced = end.end_offset < 0 or end.leader_epoch < 0
                if (unplaced or end.end_offset < offset) and self.auto_offset_reset == "none":
                    # Kafka's maybeCompleteValidation leaves the position awaiting validation:
                    # never fetched from until the application seeks, validated again (and
                    # raised again) once the request timeout after this validation has passed.
                    found[tp] = (
                        offset, None if unplaced else (end.end_offset, end.leader_epoch))
                    self._validate_after[tp] = (retry_at, part.leader_epoch)
                    continue
                self._validate_after.pop(tp, None)
                self._leader_epoch[tp] = part.leader_epoch
                if unplaced:
                    self._set(tp, None)  # reset per auto.offset.reset
                elif end.end_offset < offset:
                    # Kafka: seekValidated to the first offset known to diverge
                    self._position[tp] = end.end_offset
                    self._offset_epoch[tp] = end.leader_epoch
                else:
                    validated.append(tp)
            if not truncations:
                # Kafka raises one answer's truncations (maybeSetOffsetForLeaderException keeps
                # the first and drops a later one): another answer's await their next validation.
                truncations = found
        if truncations:  # the others of the answers are done first, as Kafka's
            raise LogTruncationError(truncations)
        return validated, retry

    async def _end_offsets(
        self, node: int, asked: dict[TopicPartition, tuple[int, PartitionMetadata]]
    ) -> dict[TopicPartition, EpochEndOffset]:
        """One OffsetsForLeaderEpoch to ``node`` (Kafka's OffsetsForLeaderEpochUtils
        .prepareRequest): each position's offset epoch under the metadata's leader epoch."""
        topics: dict[str, list[OffsetForLeaderPartition]] = {}
        for tp, (_, part) in asked.items():
            topics.setdefault(tp.topic, []).append(OffsetForLeaderPartition(
                partition=tp.partition, current_leader_epoch=part.leader_epoch,
                leader_epoch=self._offset_epoch[tp]))
        response = await self.client.send(node, OffsetForLeaderEpochRequest(
            topics=[OffsetForLeaderTopic(topic, ps) for topic, ps in topics.items()]))
        return {TopicPartition(t.topic, p.partition): p
                for t in response.topics for p in t.partitions}

    def _read_replica(self, tp: TopicPartition, part: PartitionMetadata) -> int:
        """Kafka's selectReadReplica: the preferred read replica while it has not expired and
        the metadata lists it online, else the leader."""
        preferred = self._preferred.get(tp)
        if preferred is None:
            return part.leader
        replica, until = preferred
        if (time.monotonic() < until and replica in self.client.metadata.brokers
                and replica not in part.offline_replicas):
            return replica
        del self._preferred[tp]
        return part.leader

    async def _fetch_once(self, max_wait_ms: int) -> None:
        by_node: dict[int, dict[TopicPartition, FetchPartition]] = {}
        missing: list[str] = []
        fetchable: list[tuple[TopicPartition, int, PartitionMetadata]] = []
        to_validate: dict[TopicPartition, tuple[int, PartitionMetadata]] = {}
        for tp, offset in list(self._position.items()):
            if self._buffer.get(tp):
                continue
            part = self.client.metadata.partition(tp)
            if part is None or part.leader < 0:
                missing.append(tp.topic)
                continue
            known = self._leader_epoch.get(tp, part.leader_epoch)
            if part.leader_epoch != known:
                # Kafka's maybeValidatePosition: a new leader or epoch drops the replica the
                # old one named.
                self._preferred.pop(tp, None)
            if part.leader_epoch > known and self._offset_epoch.get(tp, -1) >= 0:
                # A newer leader epoch validates again at once (maybeValidatePosition).
                after, epoch = self._validate_after.get(tp, (0.0, -1))
                if time.monotonic() >= after or part.leader_epoch != epoch:
                    to_validate[tp] = (offset, part)
                continue
            if part.leader_epoch != known or tp not in self._leader_epoch:
                self._leader_epoch[tp] = max(part.leader_epoch, known)
            fetchable.append((tp, offset, part))
        if to_validate:
            validated, retry = await self._validate_positions(to_validate)
            # Kafka: metadata.requestUpdate for the partitions to retry, then a back-off
            missing += [tp.topic for tp in retry]
            fetchable += [(tp, *to_validate[tp]) for tp in validated]
        for tp, offset, part in fetchable:
            by_node.setdefault(self._read_replica(tp, part), {})[tp] = FetchPartition(
                offset, part.leader_epoch, -1, self.max_partition_fetch_bytes)
        if self.client.metadata_stale:
            missing += [tp.topic for tp in self._position]
        if missing:
            await self._refresh(missing)
            if not by_node:
                return
        if not by_node:
            if self._validate_after:
                # Only positions awaiting validation: wait as a fetch would, not spin.
                until = min(after for after, _ in self._validate_after.values())
                await asyncio.sleep(max(0.0, min(max_wait_ms / 1000, until - time.monotonic())))
            return
        nodes = list(by_node)
        answers = await asyncio.gather(
            *(self._fetch_from(node, by_node[node], max_wait_ms) for node in nodes),
            return_exceptions=True,
        )
        stale: set[str] = set()
        for node, answer in zip(nodes, answers, strict=True):
            if isinstance(answer, (KafkaConnectionError, RequestTimedOutError)):
                stale.update(tp.topic for tp in by_node[node])
                for tp in by_node[node]:
                    self._preferred.pop(tp, None)
                continue
            if isinstance(answer, BaseException):
                raise answer
            for tp, result in answer.items():
                if tp in by_node[node]:
                    self._handle(tp, by_node[node][tp].fetch_offset, result, stale)
        if stale:
            await self._refresh(sorted(stale))

    async def _fetch_from(self, node: int, wanted: dict[TopicPartition, FetchPartition],
                          max_wait_ms: int) -> dict[TopicPartition, FetchResult]:
        """One fetch in the session with ``node``; the partitions answered (none when the
        session failed: the next fetch is then a full one)."""
        session = self._sessions.setdefault(node, FetchSessionHandler())
        session_id, epoch, to_send, to_forget = session.build(wanted)
        try:
            error, response_session_id, results = await self.client.fetch_from(
                node,
                {tp: (p.fetch_offset, p.current_leader_epoch, -1) for tp, p in to_send.items()},
                session_id=session_id,
                session_epoch=epoch,
                forgotten=to_forget,
                max_bytes=self.fetch_max_bytes,
                partition_max_bytes=self.max_partition_fetch_bytes,
                max_wait_ms=max_wait_ms,
                min_bytes=self.fetch_min_bytes,
                rack_id=self.client_rack,
            )
        except BaseException:
            session.handle_error()  # the request may or may not have moved the session on
            raise
        try:
            code = Errors(error)
        except ValueError:
            code = Errors.UNKNOWN_SERVER_ERROR
        if not session.handle_response(FetchResponseData(code, response_session_id, results)):
            return {}
        return results

    def _handle(
        self, tp: TopicPartition, fetch_offset: int, result: FetchResult, stale: set[str]
    ) -> None:
        if self._position.get(tp) != fetch_offset:
            return  # sought or reassigned while the fetch was out
        code = result.error
        if code in _FETCH_AGAIN:
            return
        if code != ErrorCode.NONE:
            # Kafka's requestMetadataUpdate (or OFFSET_OUT_OF_RANGE): back to the leader.
            if self._preferred.pop(tp, None) is not None and code == ErrorCode.OFFSET_OUT_OF_RANGE:
                return  # the follower may only lag: the leader decides
        if code == ErrorCode.NONE:
            self._high_watermark[tp] = result.high_watermark
            if result.preferred_read_replica >= 0:
                self._preferred[tp] = (result.preferred_read_replica, time.monotonic()
                                       + self.client.metadata_max_age_ms / 1000)
            self._append(tp, fetch_offset, result.records)
        elif code == ErrorCode.OFFSET_OUT_OF_RANGE:
            if self.auto_offset_reset == "none":
                raise OffsetOutOfRangeError(tp, fetch_offset)
            del self._position[tp]
            self._reset[tp] = (
                EARLIEST_TIMESTAMP if self.auto_offset_reset == "earliest" else LATEST_TIMESTAMP
            )
        elif code in _LEADER_ERRORS or _retriable(code):
            stale.add(tp.topic)
        else:
            raise BrokerResponseError(code, f"Fetch {tp} at offset {fetch_offset}")

    def _append(self, tp: TopicPartition, position: int, records: bytes | memoryview) -> None:
        out: deque[ConsumerRecord] = deque()
        next_position = position
        last_epoch = self._offset_epoch.get(tp, -1)
        try:
            for batch in iter_batches(records):
                if batch.next_offset <= next_position:
                    continue  # a compressed batch the fetch started inside of
                # Kafka's CompletedFetch lastEpoch: each batch's, empty when it has none (-1).
                last_epoch = batch.partition_leader_epoch
                if not batch.is_control_batch:
                    for rec in decode_records(batch, verify_crc=self.check_crcs):
                        if rec.offset >= next_position:
                            out.append(
                                ConsumerRecord(
                                    tp.topic,
                                    tp.partition,
                                    rec.offset,
                                    rec.timestamp,
                                    rec.key,
                                    rec.value,
                                    rec.headers,
                                )
                            )
                next_position = batch.next_offset
        except CorruptRecordError as exc:
            raise BrokerResponseError(ErrorCode.CORRUPT_MESSAGE, f"{tp}: {exc}") from exc
        self._position[tp] = next_position
        if last_epoch >= 0:
            self._offset_epoch[tp] = last_epoch
        else:
            self._offset_epoch.pop(tp, None)  # no epoch: not validated at a leader change
        if out:
            self._buffer[tp] = out

    async def _refresh(self, topics: list[str]) -> None:
        # Back off first: the cluster needs a moment to elect and publish a new leader.
        await asyncio.sleep(self.client.retry_backoff_ms / 1000)
        try:
            await self.client.refresh_metadata(sorted(set(topics)))
        except KafkaClientError:
            pass


def _retriable(code: int) -> bool:
    try:
        return ErrorCode(code).retriable
    except ValueError:
        return False
