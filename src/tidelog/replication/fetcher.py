"""The replica fetcher of seed 002 as a pure component: one ``ReplicaFetcher`` per (source broker,
fetcher id), driven by the shell's ``ReplicaFetcherManager`` (``tidelog.shell.fetcher_manager``).

Kafka's ``AbstractFetcherThread`` loops ``maybeTruncate(); maybeFetch()``. Here the loop belongs
to the shell: ``poll_requests(now_ms)`` returns the requests to send now (at most one of each kind
in flight: OffsetsForLeaderEpoch, ListOffsets, Fetch), ``handle_response(request, response,
now_ms)`` applies an answer, ``on_request_failed(request, now_ms)`` a network error. The fetcher
reads and writes the local logs through the ``logs`` callable it is given (the follower's
``Log``); it never touches a socket or a clock.

Per partition (``PartitionFetchState``): the fetch offset, the current leader epoch, the state
(Truncating / Fetching) and a back-off deadline. ``PartitionStates.update_and_move_to_end`` gives
fairness: a partition that just received data goes to the back of the fetch order.

Truncation on fetch (KIP-595's DivergingEpoch, Kafka's replica fetcher since IBP 2.7:
``ReplicationConfig.truncation_on_fetch``): a partition whose log has a leader epoch starts in
Fetching at its LEO (Kafka's ``initialFetchOffset``) and sends its last fetched epoch (the log's
latest epoch) with each fetch; when the leader's history diverges from it there, the answer
carries ``diverging_epoch`` (epoch, end offset) and no records, and the fetcher truncates by the
same rule as for an OffsetsForLeaderEpoch answer (``_truncate_to_epoch_end_offsets``), then
fetches again from its new LEO with its new latest epoch (another diverging answer if the fork
is further back). No OffsetsForLeaderEpoch is sent then.

Truncation through OffsetsForLeaderEpoch (``maybe_truncate``; without truncation on fetch: a
leader before IBP 2.7): a partition starts in Truncating. With leader epochs it asks the leader
OffsetsForLeaderEpoch(current leader epoch, its latest local epoch) and truncates to
min(its end offset for the epoch the leader answered, the leader's end offset); when it does
not know the leader's epoch it truncates to the end of its own largest smaller epoch and asks
again, until the fork is found (KIP-279). Without epochs (no epoch in the log, or
``truncate_to_hw``: pre-KIP-101) it starts in Truncating either way and truncates to the HW
(its initial fetch offset).

Fetch response errors (seed 002's table):
- NONE: append as follower; follower HW = min(own LEO, leader's HW) (seed 001); move to the end.
- OFFSET_OUT_OF_RANGE: ``fetch_offset_and_truncate``: ListOffsets(latest); if the leader's LEO is
  below ours, truncate to it; else ListOffsets(earliest) and fetch from max(leader start, our
  LEO), truncating fully first if the leader starts after our LEO.
- FENCED_LEADER_EPOCH: if our epoch is the one the request carried, the partition is removed and
  marked failed until a new LeaderAndIsr arrives; else retried after back-off.
- UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER, anything else: back off and retry.
- corrupt records: back off and retry; storage error: that partition is marked failed, the
  others continue.
A response for a partition whose fetch offset, epoch or state changed since the request was
built is ignored (KAFKA-18991), as is any response to a request that is no longer in flight.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from tidelog.protocol.records.batch import CorruptRecordError
from tidelog.replication.config import ReplicationConfig
from tidelog.replication.errors import Errors
from tidelog.replication.replication_quota import should_throttle
from tidelog.replication.types import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    EpochEndOffset,
    FetchPartitionData,
    ListOffsetsPartitionResult,
    TopicPartition,
)

try:  # the storage layer's error classes, when it is installed
    from tidelog.storage.errors import KafkaStorageError, StorageError
except ImportError:  # pragma: no cover - storage lands concurrently

    class StorageError(Exception):  # type: ignore[no-redef]
        pass

    class KafkaStorageError(StorageError):  # type: ignore[no-redef]
        pass


class ReplicaState(Enum):
    TRUNCATING = "Truncating"
    FETCHING = "Fetching"


@dataclass(frozen=True, slots=True)
class PartitionFetchState:
    fetch_offset: int
    current_leader_epoch: int
    state: ReplicaState = ReplicaState.FETCHING
    delay_until_ms: int = 0
    # The epoch of the last record fetched (the log's latest epoch), sent with each fetch when
    # truncation on fetch is on; UNDEFINED_EPOCH: none (Kafka's Option.empty).
    last_fetched_epoch: int = UNDEFINED_EPOCH

    def is_delayed(self, now_ms: int) -> bool:
        return now_ms < self.delay_until_ms

    def is_ready_for_fetch(self, now_ms: int) -> bool:
        return self.state is ReplicaState.FETCHING and not self.is_delayed(now_ms)

    def is_truncating(self, now_ms: int) -> bool:
        return self.state is ReplicaState.TRUNCATING and not self.is_delayed(now_ms)


class PartitionStates:
    """Partitions in fetch order (Kafka's ``PartitionStates``)."""

    def __init__(self) -> None:
        self._map: OrderedDict[TopicPartition, PartitionFetchState] = OrderedDict()
        # How many are Truncating: with none, the truncation pass skips the scan of them all.
        self.truncating = 0
        # Partitions whose state changed since the fetcher last built a fetch from them.
        self.changed: set[TopicPartition] = set()

    def _count(self, old: PartitionFetchState | None, new: PartitionFetchState | None) -> None:
        if old is not None and old.state is ReplicaState.TRUNCATING:
            self.truncating -= 1
        if new is not None and new.state is ReplicaState.TRUNCATING:
            self.truncating += 1

    def update_and_move_to_end(self, tp: TopicPartition, state: PartitionFetchState) -> None:
        self._count(self._map.pop(tp, None), state)
        self._map[tp] = state
        self.changed.add(tp)

    def update(self, tp: TopicPartition, state: PartitionFetchState) -> None:
        """Replace the state, keeping the partition's place in the order."""
        self._count(self._map.get(tp), state)
        self._map[tp] = state
        self.changed.add(tp)

    def remove(self, tp: TopicPartition) -> None:
        self._count(self._map.pop(tp, None), None)
        self.changed.add(tp)

    def state_value(self, tp: TopicPartition) -> PartitionFetchState | None:
        return self._map.get(tp)

    def partition_state_map(self) -> dict[TopicPartition, PartitionFetchState]:
        return dict(self._map)

    def partition_set(self) -> set[TopicPartition]:
        return set(self._map)

    def items(self) -> list[tuple[TopicPartition, PartitionFetchState]]:
        return list(self._map.items())

    def __contains__(self, tp: object) -> bool:
        return tp in self._map

    def __len__(self) -> int:
        return len(self._map)

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(list(self._map))


# ---------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class FetchPartition:
    fetch_offset: int
    current_leader_epoch: int
    log_start_offset: int
    max_bytes: int
    # Fetch v12+ (KIP-595): the leader answers a diverging epoch when it does not have this
    # epoch ending at or after the fetch offset; UNDEFINED_EPOCH: not sent.
    last_fetched_epoch: int = UNDEFINED_EPOCH


@dataclass(frozen=True, slots=True)
class FetchRequest:
    request_id: int
    source_broker: int
    replica_id: int
    broker_epoch: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    partitions: Mapping[TopicPartition, FetchPartition] = field(default_factory=dict)
    # KIP-227: the session this request belongs to and what goes on the wire. ``partitions`` is
    # always the whole set the fetcher wants (responses are matched against it); ``to_send`` are
    # the partitions listed in the request (all of them in a full fetch), ``to_forget`` the ones
    # dropped from the session.
    session_id: int = 0
    session_epoch: int = -1
    to_send: Mapping[TopicPartition, FetchPartition] | None = None
    to_forget: tuple[TopicPartition, ...] = ()

    @property
    def listed(self) -> Mapping[TopicPartition, FetchPartition]:
        """The partitions the request lists on the wire."""
        return self.partitions if self.to_send is None else self.to_send

    def fetch_args(self) -> dict[TopicPartition, tuple[int, int, int, int, int]]:
        """The ``partitions`` argument of ``ReplicaManager.fetch_messages``."""
        return {
            tp: (p.fetch_offset, p.current_leader_epoch, p.log_start_offset, p.max_bytes,
                 p.last_fetched_epoch)
            for tp, p in self.partitions.items()
        }


@dataclass(frozen=True, slots=True)
class OffsetsForLeaderEpochRequest:
    request_id: int
    source_broker: int
    replica_id: int
    # tp -> (current_leader_epoch, leader_epoch to look up)
    partitions: Mapping[TopicPartition, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest:
    request_id: int
    source_broker: int
    replica_id: int
    # tp -> (current_leader_epoch, LATEST_TIMESTAMP or EARLIEST_TIMESTAMP)
    partitions: Mapping[TopicPartition, tuple[int, int]] = field(default_factory=dict)


FetcherRequest = FetchRequest | OffsetsForLeaderEpochRequest | ListOffsetsRequest


@dataclass(frozen=True, slots=True)
class FetchResponseData:
    """A fetch response with its session fields (a plain mapping is a sessionless answer)."""

    error: Errors
    session_id: int
    partitions: Mapping[TopicPartition, FetchPartitionData] = field(default_factory=dict)


INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
_INT_MAX = 2**31 - 1


class FetchSessionHandler:
    """The fetcher's side of a fetch session (Kafka's clients ``FetchSessionHandler``).

    ``build`` turns the partitions the fetcher wants into a request: a full fetch (epoch 0, every
    partition) while there is no session, then incremental fetches listing only the partitions
    whose fetch offset, log start offset, leader epoch or max bytes changed (added or altered) and
    forgetting those no longer wanted. ``handle_response`` moves the session on; a session error
    (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH), an inconsistent response or a lost
    request makes the next request a full fetch again.
    """

    def __init__(self) -> None:
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self.session_partitions: dict[TopicPartition, FetchPartition] = {}

    @property
    def is_full(self) -> bool:
        return self.epoch == INITIAL_EPOCH

    def build(self, wanted: Mapping[TopicPartition, FetchPartition]) -> tuple[
            int, int, Mapping[TopicPartition, FetchPartition], tuple[TopicPartition, ...]]:
        """(session id, epoch, partitions to list, partitions to forget) for the next request."""
        if self.is_full:
            self.session_partitions = dict(wanted)
            return self.session_id, self.epoch, dict(wanted), ()
        to_forget = tuple(tp for tp in self.session_partitions if tp not in wanted)
        last = self.session_partitions
        to_send = {tp: data for tp, data in wanted.items()
                   if (old := last.get(tp)) is not data and old != data}
        self.session_partitions = dict(wanted)
        return self.session_id, self.epoch, to_send, to_forget

    def build_changed(self, wanted: Mapping[TopicPartition, FetchPartition],
                      touched: Iterable[TopicPartition]) -> tuple[
            int, int, Mapping[TopicPartition, FetchPartition], tuple[TopicPartition, ...]]:
        """``build`` of an incremental fetch when only ``touched`` partitions can differ from
        the last request: O(touched), not O(session)."""
        last = self.session_partitions
        to_send: dict[TopicPartition, FetchPartition] = {}
        to_forget: list[TopicPartition] = []
        for tp in touched:
            data = wanted.get(tp)
            old = last.get(tp)
            if data is None:
                if old is not None:
                    to_forget.append(tp)
            elif old is not data and old != data:
                to_send[tp] = data
        self.session_partitions = dict(wanted)
        return self.session_id, self.epoch, to_send, tuple(to_forget)

    def handle_response(self, response: FetchResponseData) -> bool:
        """Move the session on; False when the response's partitions must not be used."""
        if response.error != Errors.NONE:
            if response.error == Errors.FETCH_SESSION_ID_NOT_FOUND:
                self._reset()
            else:
                self._close_existing()
            return False
        if self.is_full:
            if set(response.partitions) != set(self.session_partitions):
                self._reset()  # extra or omitted partitions in a full response
                return False
            if response.session_id == INVALID_SESSION_ID:
                self._reset()  # no slot for a session at the broker: full fetches go on
            else:
                self.session_id, self.epoch = response.session_id, 1
            return True
        session_partitions = self.session_partitions
        if not all(tp in session_partitions for tp in response.partitions):
            self._close_existing()
            return False
        if response.session_id == INVALID_SESSION_ID:
            self._reset()
        else:
            self.epoch = 1 if self.epoch == _INT_MAX else self.epoch + 1
        return True

    def handle_sessionless_response(self) -> None:
        """A plain mapping came back (an in-process transport without sessions)."""
        self._reset()

    def handle_error(self) -> None:
        """The request was lost: the next one is full and closes the session."""
        self._close_existing()

    def _reset(self) -> None:
        self.session_id, self.epoch = INVALID_SESSION_ID, INITIAL_EPOCH

    def _close_existing(self) -> None:
        self.epoch = INITIAL_EPOCH


@dataclass(slots=True)
class FetchResult:
    """What ``process_fetch_response`` did (for traces and metrics)."""

    appended: dict[TopicPartition, Any] = field(default_factory=dict)  # tp -> LogAppendInfo
    errors: dict[TopicPartition, Errors] = field(default_factory=dict)
    ignored: set[TopicPartition] = field(default_factory=set)
    failed: set[TopicPartition] = field(default_factory=set)
    # Kafka's partitionsWithNewHighWatermark: the follower HW moved (consumers may read more)
    new_high_watermark: list[TopicPartition] = field(default_factory=list)


# The follower's log for a partition, or None when it is not (or no longer) a local follower.
LogLookup = Callable[[TopicPartition], Any]


class ReplicaFetcher:
    def __init__(
        self,
        broker_id: int,
        source_broker: int,
        logs: LogLookup,
        config: ReplicationConfig | None = None,
        *,
        broker_epoch: int = 0,
        first_request_id: int = 0,
    ) -> None:
        self.broker_id = broker_id
        self.source_broker = source_broker
        self.config = config or ReplicationConfig()
        self.broker_epoch = broker_epoch
        self._logs = logs
        # Kafka's isTruncationOnFetchSupported (2.7); never with the naive rules of the brokers
        # before it: truncation to the HW (pre-KIP-101), no epoch fencing (pre-KIP-320).
        self.truncation_on_fetch = (self.config.truncation_on_fetch
                                    and not self.config.truncate_to_hw
                                    and self.config.fence_leader_epochs)
        self.partition_states = PartitionStates()
        self.failed_partitions: set[TopicPartition] = set()
        # tp -> the ListOffsets timestamp being asked (out-of-range handling in progress)
        self._offset_resets: dict[TopicPartition, int] = {}
        self._in_flight: dict[type, tuple[FetcherRequest, int]] = {}
        self._next_request_id = first_request_id
        self.session = FetchSessionHandler()
        # Per partition: the leader's HW minus our next offset at the last answer (Kafka's
        # PartitionFetchState.lag); 0 = in sync, which a follower throttle never holds back.
        self._lag: dict[TopicPartition, int] = {}
        # The partitions of the last fetch built, and when to build one from every partition
        # again (between, only the partitions that changed are looked at: build_fetch).
        self._wanted: dict[TopicPartition, FetchPartition] | None = None
        self._next_full_build_ms = 0
        # Partitions backed off, until when (next_wakeup_ms, build_fetch).
        self._delayed: dict[TopicPartition, int] = {}

    # ------------------------------------------------------------------ partitions
    def add_partitions(
        self, initial: Mapping[TopicPartition, tuple[int, int]], now_ms: int
    ) -> None:
        """``{tp: (fetch_offset, leader_epoch)}`` (the fetch offset: the HW): Kafka's
        ``partitionFetchState``. With truncation on fetch and a leader epoch in the log, Fetching
        from the LEO with the log's latest epoch (Kafka's ``initialFetchOffset``); else
        Truncating from the HW (KIP-101/279, or to the HW without epochs). A partition already
        here with the same leader epoch keeps its state (Kafka does the same)."""
        for tp, (fetch_offset, leader_epoch) in initial.items():
            self.failed_partitions.discard(tp)
            current = self.partition_states.state_value(tp)
            if current is not None and current.current_leader_epoch == leader_epoch:
                continue
            self._offset_resets.pop(tp, None)
            self._lag.pop(tp, None)
            log = self._logs(tp) if self.truncation_on_fetch else None
            latest_epoch = None if log is None else log.latest_epoch
            if log is not None and latest_epoch is not None:
                new = PartitionFetchState(log.log_end_offset, leader_epoch,
                                          last_fetched_epoch=latest_epoch)
            else:
                new = PartitionFetchState(fetch_offset, leader_epoch, ReplicaState.TRUNCATING)
            self.partition_states.update_and_move_to_end(tp, new)

    def remove_partitions(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self.partition_states.remove(tp)
            self._offset_resets.pop(tp, None)
            self._lag.pop(tp, None)

    def mark_partition_failed(self, tp: TopicPartition) -> None:
        self.remove_partitions([tp])
        self.failed_partitions.add(tp)

    @property
    def is_idle(self) -> bool:
        return len(self.partition_states) == 0 and not self._in_flight

    def in_flight(self) -> list[FetcherRequest]:
        return [request for request, _ in self._in_flight.values()]

    # ------------------------------------------------------------------ the loop
    def poll_requests(self, now_ms: int) -> list[FetcherRequest]:
        """Everything to send now: at most one request of each kind in flight. A request without
        an answer for ``replica.socket.timeout.ms`` counts as failed first."""
        for request, sent_ms in list(self._in_flight.values()):
            if now_ms - sent_ms >= self.config.replica_socket_timeout_ms:
                self.on_request_failed(request, now_ms)
        out: list[FetcherRequest] = []
        for build in (self.maybe_truncate, self.build_list_offsets, self.build_fetch):
            request = build(now_ms)
            if request is not None:
                out.append(request)
        return out

    def handle_response(self, request: FetcherRequest,
                        response: Mapping[TopicPartition, Any] | FetchResponseData,
                        now_ms: int) -> FetchResult | None:
        if isinstance(request, FetchRequest):
            return self.process_fetch_response(request, response, now_ms)
        assert not isinstance(response, FetchResponseData)
        if isinstance(request, OffsetsForLeaderEpochRequest):
            self.process_offsets_for_leader_epoch_response(request, response, now_ms)
        else:
            self.process_list_offsets_response(request, response, now_ms)
        return None

    def on_request_failed(self, request: FetcherRequest, now_ms: int) -> None:
        """The request or its response was lost / timed out: back off its partitions."""
        if not self._take_in_flight(request):
            return
        if isinstance(request, FetchRequest):
            self.session.handle_error()
        self._delay_partitions(request.partitions, now_ms)

    def next_wakeup_ms(self, now_ms: int) -> int | None:
        """When something may change without a response: a back-off ending or a timeout."""
        times = [until for until in self._delayed.values() if until > now_ms]
        times += [sent + self.config.replica_socket_timeout_ms for _, sent in self._in_flight.values()]
        return min(times) if times else None

    def _new_request_id(self) -> int:
        self._next_request_id += 1
        return self._next_request_id

    def _send(self, request: FetcherRequest, now_ms: int) -> FetcherRequest:
        self._in_flight[type(request)] = (request, now_ms)
        return request

    def _take_in_flight(self, request: FetcherRequest) -> bool:
        current = self._in_flight.get(type(request))
        if current is None or current[0].request_id != request.request_id:
            return False  # an old or unknown request: nothing to do
        del self._in_flight[type(request)]
        return True

    def _delay_partitions(self, tps: Iterable[TopicPartition], now_ms: int) -> None:
        until = now_ms + self.config.replica_fetch_backoff_ms
        for tp in tps:
            state = self.partition_states.state_value(tp)
            # Kafka's delayPartitions: a partition still backing off keeps its first deadline.
            if state is not None and not state.is_delayed(now_ms):
                self._delayed[tp] = until
                self.partition_states.update_and_move_to_end(tp, replace(state, delay_until_ms=until))

    def _on_partition_fenced(self, tp: TopicPartition, request_epoch: int) -> bool:
        """FENCED_LEADER_EPOCH: our epoch is older than the leader's. If it is still the one we
        sent, stop until LeaderAndIsr brings the new epoch (False); else retry (True)."""
        state = self.partition_states.state_value(tp)
        if state is None:
            return False
        if state.current_leader_epoch == request_epoch:
            self.mark_partition_failed(tp)
            return False
        return True

    # ------------------------------------------------------------------ truncation
    def maybe_truncate(self, now_ms: int) -> OffsetsForLeaderEpochRequest | None:
        with_epochs: dict[TopicPartition, tuple[int, int]] = {}
        if self.partition_states.truncating == 0:
            return None
        for tp, state in self.partition_states.items():
            if not state.is_truncating(now_ms):
                continue
            log = self._logs(tp)
            if log is None:
                continue
            latest_epoch = log.latest_epoch
            if self.config.truncate_to_hw or latest_epoch is None:
                self._truncate_to_high_watermark(tp, state, log)
            else:
                with_epochs[tp] = (state.current_leader_epoch, latest_epoch)
        if not with_epochs or OffsetsForLeaderEpochRequest in self._in_flight:
            return None
        request = OffsetsForLeaderEpochRequest(
            self._new_request_id(), self.source_broker, self.broker_id, with_epochs
        )
        return self._send(request, now_ms)  # type: ignore[return-value]

    def _truncate_to_high_watermark(self, tp: TopicPartition, state: PartitionFetchState,
                                    log: Any) -> None:
        # seed 002's truncateToHighWatermark: the initial fetch offset is the HW.
        offset = self._truncate(tp, log, min(state.fetch_offset, log.log_end_offset))
        if offset is None:
            return
        self.partition_states.update(tp, self._fetching(offset, state, log))

    def _fetching(self, offset: int, state: PartitionFetchState, log: Any,
                  truncation_complete: bool = True) -> PartitionFetchState:
        """The state after a truncation or an offset reset, at ``offset`` (Kafka's
        updateFetchOffsetAndMaybeMarkTruncationComplete): Fetching, with the log's latest epoch
        as the last fetched one; an incomplete KIP-279 truncation stays Truncating unless
        truncation on fetch is on (its next fetch then finds the rest of the fork)."""
        if not (truncation_complete or self.truncation_on_fetch):
            return PartitionFetchState(offset, state.current_leader_epoch,
                                       ReplicaState.TRUNCATING)
        latest_epoch = log.latest_epoch if self.truncation_on_fetch else None
        return PartitionFetchState(
            offset, state.current_leader_epoch,
            last_fetched_epoch=UNDEFINED_EPOCH if latest_epoch is None else latest_epoch)

    def _truncate(self, tp: TopicPartition, log: Any, offset: int) -> int | None:
        """Truncate to ``offset``; returns the offset to fetch from next (the new LEO: a batch
        straddling ``offset`` goes whole), or None when the log failed."""
        try:
            # Also at the LEO (Kafka's truncate does): the log then drops epoch-cache entries
            # starting there, an epoch this replica assigned as a leader and never wrote in.
            log.truncate_to(min(offset, log.log_end_offset))
            return min(offset, log.log_end_offset)
        except StorageError:
            self.mark_partition_failed(tp)
            return None

    def process_offsets_for_leader_epoch_response(
        self,
        request: OffsetsForLeaderEpochRequest,
        response: Mapping[TopicPartition, EpochEndOffset],
        now_ms: int,
    ) -> None:
        if not self._take_in_flight(request):
            return
        with_error: set[TopicPartition] = set()
        answers: dict[TopicPartition, tuple[int, EpochEndOffset]] = {}
        for tp, (request_epoch, _) in request.partitions.items():
            state = self.partition_states.state_value(tp)
            if (
                state is None
                or state.state is not ReplicaState.TRUNCATING
                or state.current_leader_epoch != request_epoch
            ):
                continue  # changed since the request: its answer no longer applies
            answer = response.get(tp)
            if answer is None:
                with_error.add(tp)
            else:
                answers[tp] = (request_epoch, answer)
        with_error |= self._truncate_to_epoch_end_offsets(answers)
        self._delay_partitions(with_error, now_ms)

    def _truncate_to_epoch_end_offsets(
        self, answers: Mapping[TopicPartition, tuple[int, EpochEndOffset]]
    ) -> set[TopicPartition]:
        """Kafka's maybeTruncateToEpochEndOffsets + updateFetchOffsetAndMaybeMarkTruncationComplete,
        for OffsetsForLeaderEpoch answers and a fetch answer's diverging epochs alike:
        ``{tp: (the current leader epoch the request carried, the leader's epoch end offset)}``;
        returns the partitions to back off."""
        with_error: set[TopicPartition] = set()
        for tp, (request_epoch, answer) in answers.items():
            state = self.partition_states.state_value(tp)
            if state is None:
                continue
            if answer.error == Errors.FENCED_LEADER_EPOCH:
                if self._on_partition_fenced(tp, request_epoch):
                    with_error.add(tp)
                continue
            if answer.error != Errors.NONE:
                with_error.add(tp)
                continue
            log = self._logs(tp)
            if log is None:
                continue
            target, completed = self.get_offset_truncation_state(state, log, answer)
            offset = self._truncate(tp, log, target)
            if offset is None:
                continue
            self.partition_states.update(tp, self._fetching(offset, state, log, completed))
        return with_error

    @staticmethod
    def get_offset_truncation_state(
        state: PartitionFetchState, log: Any, leader: EpochEndOffset
    ) -> tuple[int, bool]:
        """KIP-279: (offset to truncate to, whether truncation is complete)."""
        replica_end = log.log_end_offset
        if leader.end_offset == UNDEFINED_EPOCH_OFFSET:
            # The leader knows no such epoch: fall back to the initial fetch offset (the HW).
            return min(state.fetch_offset, replica_end), True
        if leader.leader_epoch == UNDEFINED_EPOCH:
            return min(leader.end_offset, replica_end), True
        follower_epoch, follower_end = log.end_offset_for_epoch(leader.leader_epoch)
        if follower_end == UNDEFINED_EPOCH_OFFSET:
            return min(leader.end_offset, replica_end), True
        if follower_epoch != leader.leader_epoch:
            # We do not have the epoch the leader answered with: cut to the end of our largest
            # epoch below it and ask again with our new latest epoch.
            return min(follower_end, replica_end), False
        return min(follower_end, leader.end_offset, replica_end), True

    # ------------------------------------------------------------------ out of range
    def build_list_offsets(self, now_ms: int) -> ListOffsetsRequest | None:
        if ListOffsetsRequest in self._in_flight or not self._offset_resets:
            return None
        parts: dict[TopicPartition, tuple[int, int]] = {}
        for tp, timestamp in self._offset_resets.items():
            state = self.partition_states.state_value(tp)
            if state is not None and not state.is_delayed(now_ms):
                parts[tp] = (state.current_leader_epoch, timestamp)
        if not parts:
            return None
        request = ListOffsetsRequest(self._new_request_id(), self.source_broker, self.broker_id, parts)
        return self._send(request, now_ms)  # type: ignore[return-value]

    def process_list_offsets_response(
        self,
        request: ListOffsetsRequest,
        response: Mapping[TopicPartition, ListOffsetsPartitionResult],
        now_ms: int,
    ) -> None:
        """seed 002's ``fetchOffsetAndTruncate``, one ListOffsets round at a time."""
        if not self._take_in_flight(request):
            return
        self.partition_states.changed.update(request.partitions)  # resets taken or moved on
        with_error: set[TopicPartition] = set()
        for tp, (request_epoch, timestamp) in request.partitions.items():
            state = self.partition_states.state_value(tp)
            if (
                state is None
                or self._offset_resets.get(tp) != timestamp
                or state.current_leader_epoch != request_epoch
            ):
                continue
            answer = response.get(tp)
            if answer is None or answer.error != Errors.NONE:
                if answer is not None and answer.error == Errors.FENCED_LEADER_EPOCH:
                    if self._on_partition_fenced(tp, request_epoch):
                        with_error.add(tp)
                else:
                    with_error.add(tp)
                continue
            log = self._logs(tp)
            if log is None:
                continue
            if timestamp == LATEST_TIMESTAMP:
                offset = self.fetch_offset_and_truncate(tp, log, leader_end_offset=answer.offset)
            else:
                offset = self.fetch_offset_and_truncate(tp, log, leader_start_offset=answer.offset)
            if offset is None:
                self._offset_resets[tp] = EARLIEST_TIMESTAMP  # the leader's start is needed too
            elif offset >= 0:
                self._reset_done(tp, state, offset, log)
        self._delay_partitions(with_error, now_ms)

    def fetch_offset_and_truncate(
        self,
        tp: TopicPartition,
        log: Any,
        *,
        leader_end_offset: int | None = None,
        leader_start_offset: int | None = None,
    ) -> int | None:
        """seed 002's ``fetchOffsetAndTruncate`` in two rounds: with the leader's LEO (round 1)
        and, if needed, its log start offset (round 2). Returns the offset to fetch from, None
        when round 2 is needed, -1 when the log failed.

        Case 1 (unclean election): the leader's LEO is below ours: truncate to it.
        Case 2: otherwise fetch from max(leader's log start, our LEO); if the leader's log starts
        past our LEO (it deleted what we miss), restart our log empty at its start."""
        replica_end = log.log_end_offset
        if leader_end_offset is not None:
            if leader_end_offset < replica_end:
                offset = self._truncate(tp, log, leader_end_offset)
                return -1 if offset is None else offset
            return None
        assert leader_start_offset is not None
        if leader_start_offset > replica_end:
            try:
                log.truncate_fully_and_start_at(leader_start_offset)
            except StorageError:
                self.mark_partition_failed(tp)
                return -1
        return max(leader_start_offset, replica_end)

    def _reset_done(self, tp: TopicPartition, state: PartitionFetchState, offset: int,
                    log: Any) -> None:
        self._offset_resets.pop(tp, None)
        self.partition_states.update_and_move_to_end(tp, self._fetching(offset, state, log))

    # ------------------------------------------------------------------ fetch
    def build_fetch(self, now_ms: int) -> FetchRequest | None:
        if FetchRequest in self._in_flight:
            return None
        quota = self.config.follower_quota
        if (self._wanted is None or self.session.is_full or now_ms >= self._next_full_build_ms
                or (quota is not None and quota.throttles_any)):
            parts = self._wanted_from_all(now_ms)
            session_id, epoch, to_send, to_forget = self.session.build(parts)
        else:
            parts, touched = self._wanted_from_changes(self._wanted, now_ms)
            session_id, epoch, to_send, to_forget = self.session.build_changed(parts, touched)
        self._wanted = parts
        if not parts:
            return None
        request = FetchRequest(
            self._new_request_id(),
            self.source_broker,
            self.broker_id,
            self.broker_epoch,
            self.config.replica_fetch_wait_max_ms,
            self.config.replica_fetch_min_bytes,
            self.config.replica_fetch_response_max_bytes,
            parts,
            session_id,
            epoch,
            to_send,
            to_forget,
        )
        return self._send(request, now_ms)  # type: ignore[return-value]

    # A build from every partition at least this often: it also sees what changes without a
    # state change (the local log start moved by retention).
    FULL_BUILD_INTERVAL_MS = 10_000

    def _wanted_from_changes(self, last: dict[TopicPartition, FetchPartition], now_ms: int
                             ) -> tuple[dict[TopicPartition, FetchPartition], set[TopicPartition]]:
        """The partitions to fetch, from the last ones and the partitions that changed state
        or whose back-off ended: an idle round trip costs O(changed), not O(partitions)."""
        touched = self.partition_states.changed
        self.partition_states.changed = set()
        for tp, until in list(self._delayed.items()):
            if until <= now_ms:
                del self._delayed[tp]
                touched.add(tp)
        parts = dict(last)
        for tp in touched:
            state = self.partition_states.state_value(tp)
            data = None if state is None else self._fetch_partition(tp, state, now_ms, last.get(tp))
            if data is None:
                parts.pop(tp, None)
            else:
                parts[tp] = data
        return parts, touched

    def _fetch_partition(self, tp: TopicPartition, state: PartitionFetchState, now_ms: int,
                         prev: FetchPartition | None) -> FetchPartition | None:
        if not state.is_ready_for_fetch(now_ms) or tp in self._offset_resets:
            return None
        log = self._logs(tp)
        if log is None:
            return None
        return self._partition_data(state, log.log_start_offset,
                                    self.config.replica_fetch_max_bytes, prev)

    def _partition_data(self, state: PartitionFetchState, log_start: int, max_bytes: int,
                        prev: FetchPartition | None) -> FetchPartition:
        """What the fetch asks of one partition; ``prev`` itself when nothing changed (the
        session's diff then compares by identity)."""
        # Kafka's buildFetch: the last fetched epoch only with truncation on fetch.
        last_epoch = state.last_fetched_epoch if self.truncation_on_fetch else UNDEFINED_EPOCH
        if (prev is not None and prev.fetch_offset == state.fetch_offset
                and prev.current_leader_epoch == state.current_leader_epoch
                and prev.log_start_offset == log_start and prev.max_bytes == max_bytes
                and prev.last_fetched_epoch == last_epoch):
            return prev
        return FetchPartition(state.fetch_offset, state.current_leader_epoch, log_start,
                              max_bytes, last_epoch)

    def _wanted_from_all(self, now_ms: int) -> dict[TopicPartition, FetchPartition]:
        self.partition_states.changed = set()
        self._next_full_build_ms = now_ms + self.FULL_BUILD_INTERVAL_MS
        self._delayed = {tp: st.delay_until_ms for tp, st in self.partition_states.items()
                         if st.delay_until_ms > now_ms}
        parts: dict[TopicPartition, FetchPartition] = {}
        last = self.session.session_partitions
        max_bytes = self.config.replica_fetch_max_bytes
        for tp, state in self.partition_states.items():
            if not state.is_ready_for_fetch(now_ms) or tp in self._offset_resets:
                continue
            # Kafka's shouldFollowerThrottle: left out, asked again after the back-off. Unlike
            # Kafka, a partition whose lag is not known yet (just added: a new leader) is not
            # held back: after a move completes, the new leader's HW waits for this replica,
            # and holding it back stalled acks=all producers for seconds (bench/reassign.py).
            if should_throttle(self.config.follower_quota, tp, self._lag.get(tp, 0) <= 0,
                               now_ms):
                self._delay_partitions([tp], now_ms)
                continue
            log = self._logs(tp)
            if log is None:
                continue
            parts[tp] = self._partition_data(state, log.log_start_offset, max_bytes, last.get(tp))
        return parts

    def process_fetch_response(
        self,
        request: FetchRequest,
        response: Mapping[TopicPartition, FetchPartitionData] | FetchResponseData,
        now_ms: int,
    ) -> FetchResult:
        result = FetchResult()
        partitions = response.partitions if isinstance(response, FetchResponseData) else response
        if not self._take_in_flight(request):
            result.ignored.update(partitions)
            return result
        if isinstance(response, FetchResponseData):
            if not self.session.handle_response(response):
                # As Kafka's fetcher: nothing of it is used, the next fetch (full) goes at once.
                result.ignored.update(partitions)
                return result
        else:
            self.session.handle_sessionless_response()
        response = partitions
        # Whatever happens to them here (log start, offset reset), look at them next build.
        self.partition_states.changed.update(response)
        with_error: set[TopicPartition] = set()
        diverging: dict[TopicPartition, tuple[int, EpochEndOffset]] = {}
        for tp, data in response.items():
            sent = request.partitions.get(tp)
            state = self.partition_states.state_value(tp)
            if (
                sent is None
                or state is None
                or state.state is not ReplicaState.FETCHING
                or tp in self._offset_resets
                or state.fetch_offset != sent.fetch_offset
                or state.current_leader_epoch != sent.current_leader_epoch
            ):
                result.ignored.add(tp)
                continue
            error = data.error
            if error != Errors.NONE:
                result.errors[tp] = error
            if error == Errors.NONE and data.diverging_epoch is not None \
                    and self.truncation_on_fetch:
                # No records come with it (Kafka's Partition.readRecords). Kafka's follower
                # still takes the answer's HW and log start before truncating
                # (processPartitionData); tidelog takes neither until the next answer: when
                # the follower lacks the leader's epoch (KIP-279's intermediate cut) the HW
                # would cover records that still diverge until that answer.
                epoch, end_offset = data.diverging_epoch
                diverging[tp] = (sent.current_leader_epoch,
                                 EpochEndOffset(Errors.NONE, epoch, end_offset))
            elif error == Errors.NONE:
                self._handle_partition_data(tp, state, data, now_ms, result, with_error)
            elif error == Errors.OFFSET_OUT_OF_RANGE:
                self._offset_resets[tp] = LATEST_TIMESTAMP
            elif error == Errors.FENCED_LEADER_EPOCH:
                if self._on_partition_fenced(tp, sent.current_leader_epoch):
                    with_error.add(tp)
                elif tp in self.failed_partitions:
                    result.failed.add(tp)
            else:  # UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER, storage errors at the leader, ...
                with_error.add(tp)
        if diverging:  # Kafka's truncateOnFetchResponse
            with_error |= self._truncate_to_epoch_end_offsets(diverging)
        self._delay_partitions(with_error, now_ms)
        return result

    def _handle_partition_data(
        self,
        tp: TopicPartition,
        state: PartitionFetchState,
        data: FetchPartitionData,
        now_ms: int,
        result: FetchResult,
        with_error: set[TopicPartition],
    ) -> None:
        log = self._logs(tp)
        if log is None:
            result.ignored.add(tp)
            return
        high_watermark = log.high_watermark
        try:
            info = self.process_partition_data(tp, state.fetch_offset, log, data, now_ms)
        except CorruptRecordError:
            # Possibly a transient state of the leader's log: retry after the back-off.
            result.errors[tp] = Errors.CORRUPT_MESSAGE
            with_error.add(tp)
            return
        except (StorageError, OffsetMismatchError) as e:
            result.errors[tp] = (
                Errors.KAFKA_STORAGE_ERROR if isinstance(e, KafkaStorageError) else Errors.UNKNOWN_SERVER_ERROR
            )
            self.mark_partition_failed(tp)
            result.failed.add(tp)
            return
        if log.high_watermark != high_watermark:
            result.new_high_watermark.append(tp)
        quota = self.config.follower_quota
        if quota is not None and quota.is_throttled(tp):
            quota.record(len(data.records), now_ms)
        next_offset = info.last_offset + 1 if info is not None and info.valid_bytes > 0 \
            else state.fetch_offset
        if data.high_watermark >= 0:
            self._lag[tp] = max(0, data.high_watermark - next_offset)
        if info is not None and info.valid_bytes > 0 and tp in self.partition_states:
            result.appended[tp] = info
            # Kafka: the last appended batch's leader epoch, i.e. the log's latest epoch now.
            latest_epoch = log.latest_epoch if self.truncation_on_fetch else None
            self.partition_states.update_and_move_to_end(
                tp, PartitionFetchState(
                    info.last_offset + 1, state.current_leader_epoch,
                    last_fetched_epoch=(state.last_fetched_epoch if latest_epoch is None
                                        else latest_epoch)))

    @staticmethod
    def process_partition_data(
        tp: TopicPartition, fetch_offset: int, log: Any, data: FetchPartitionData, now_ms: int
    ) -> Any:
        """Append the fetched batches as follower, then follower HW = min(LEO, leader HW)."""
        if log.log_end_offset != fetch_offset:
            raise OffsetMismatchError(
                f"{tp}: fetch offset {fetch_offset} != local log end offset {log.log_end_offset}"
            )
        info = None
        if len(data.records) > 0:
            info = log.append_as_follower(data.records, now_ms)
        if data.high_watermark >= 0:
            log.update_high_watermark(min(log.log_end_offset, data.high_watermark))
        # Follow the leader's log start offset (retention / DeleteRecords), never past our HW.
        if log.log_start_offset < data.log_start_offset <= log.high_watermark:
            log.maybe_increment_log_start_offset(data.log_start_offset)
        return info


class OffsetMismatchError(Exception):
    """The local log moved under the fetcher (Kafka's "Offset mismatch" IllegalStateException)."""
