"""Delayed operations and their purgatory (seed 000's ``tryCompleteDelayedRequests``, seed 004).

A request that cannot be answered yet waits here, watched under each partition it touches:

- ``DelayedProduce`` (acks=all): done for a partition when its HW reached the offset after the
  append with enough replicas in the ISR, or with an error when the ISR fell below
  min.insync.replicas or leadership was lost; the whole request is answered when every
  partition is done, or at its deadline (REQUEST_TIMED_OUT for the rest).
- ``DelayedFetch``: done when ``fetch.min.bytes`` are readable (below the HW for consumers, the LEO
  for followers), when a partition's leadership / epoch / log changed under it, or at
  ``fetch.max.wait.ms``; then it reads again and answers with what is there.

The owner calls ``check_and_complete(tp, now_ms)`` whenever a partition's LEO, HW, ISR or role
changes, and ``expire(now_ms)`` as time passes; both return the completions. No clock here:
deadlines are compared with the ``now_ms`` passed in.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

from tidelog.replication.errors import Errors
from tidelog.replication.types import (
    CompleteFetch,
    CompleteProduce,
    Completion,
    ProducePartitionResult,
    TopicPartition,
)


class DelayedOperation:
    """Base: ``keys`` to watch, a ``deadline_ms``, ``try_complete`` / ``expire_now``."""

    def __init__(self, request_key: Hashable, deadline_ms: int,
                 keys: tuple[TopicPartition, ...]) -> None:
        self.request_key = request_key
        self.deadline_ms = deadline_ms
        self.keys = keys
        self.completion: Completion | None = None

    @property
    def is_completed(self) -> bool:
        return self.completion is not None

    def try_complete(self, now_ms: int) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def expire_now(self, now_ms: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def pending_offset(self, key: TopicPartition) -> int | None:
        """An offset this operation still waits for on ``key`` with a check monotonic in it
        (not done at an offset means not done at any higher one, in the same partition
        state), or None: lets the purgatory skip the later ones after one failed."""
        return None


@dataclass(slots=True)
class ProducePartitionStatus:
    required_offset: int  # the LEO just after this request's append
    result: ProducePartitionResult
    acks_pending: bool = True


# check(tp, required_offset) -> (done, error): Partition.check_enough_replicas_reach_offset, or
# (True, error) when the partition is gone.
ReplicaCheck = Callable[[TopicPartition, int], "tuple[bool, Errors]"]


class DelayedProduce(DelayedOperation):
    def __init__(
        self,
        request_key: Hashable,
        deadline_ms: int,
        statuses: Mapping[TopicPartition, ProducePartitionStatus],
        check: ReplicaCheck,
    ) -> None:
        super().__init__(request_key, deadline_ms, tuple(statuses))
        self.statuses = dict(statuses)
        self._check = check

    def try_complete(self, now_ms: int) -> bool:
        if self.is_completed:
            return True
        pending = False
        for tp, status in self.statuses.items():
            if not status.acks_pending:
                continue
            done, error = self._check(tp, status.required_offset)
            if done:
                status.acks_pending = False
                if error != Errors.NONE:
                    status.result = ProducePartitionResult(error)
            else:
                pending = True
        if pending:
            return False
        self._finish()
        return True

    def pending_offset(self, key: TopicPartition) -> int | None:
        # Partition.check_enough_replicas_reach_offset is not done only while the leader's
        # HW is below the offset (with enough replicas in the ISR): monotonic in the offset.
        status = self.statuses.get(key)
        return status.required_offset if status is not None and status.acks_pending else None

    def expire_now(self, now_ms: int) -> None:
        if self.is_completed:
            return
        self.try_complete(now_ms)
        if self.is_completed:
            return
        for status in self.statuses.values():
            if status.acks_pending:
                status.acks_pending = False
                status.result = ProducePartitionResult(Errors.REQUEST_TIMED_OUT)
        self._finish()

    def _finish(self) -> None:
        self.completion = CompleteProduce(
            self.request_key, {tp: s.result for tp, s in self.statuses.items()}
        )


@dataclass(frozen=True, slots=True)
class FetchPartitionStatus:
    fetch_offset: int
    current_leader_epoch: int
    log_start_offset: int
    max_bytes: int
    # Fetch v12+ (KIP-320/595): the epoch of the fetcher's last record, -1 for none. The
    # leader answers a history that diverges from its own with its end (diverging_epoch).
    last_fetched_epoch: int = -1


@dataclass(slots=True)
class FetchParams:
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    broker_epoch: int | None = None
    partitions: dict[TopicPartition, FetchPartitionStatus] = field(default_factory=dict)
    isolation_level: int = 0  # READ_COMMITTED (1): consumers read up to the LSO
    # Kafka's FetchParams.fetchOnlyLeader: a follower's fetch, or a consumer's before Fetch v11
    # (no client metadata). From v11 a consumer may read a follower, up to its HW (KIP-392).
    fetch_only_leader: bool = True


class DelayedFetch(DelayedOperation):
    """``readable(params) -> (bytes_readable, must_complete)`` measures what the fetch would get
    now without side effects; ``complete(params, now_ms) -> CompleteFetch`` reads for real."""

    def __init__(
        self,
        request_key: Hashable,
        deadline_ms: int,
        params: FetchParams,
        readable: Callable[[FetchParams], tuple[int, bool]],
        complete: Callable[[Hashable, FetchParams, int], CompleteFetch],
    ) -> None:
        super().__init__(request_key, deadline_ms, tuple(params.partitions))
        self.params = params
        self._readable = readable
        self._complete = complete

    def try_complete(self, now_ms: int) -> bool:
        if self.is_completed:
            return True
        available, must_complete = self._readable(self.params)
        if must_complete or available >= self.params.min_bytes:
            self.completion = self._complete(self.request_key, self.params, now_ms)
            return True
        return False

    def expire_now(self, now_ms: int) -> None:
        if not self.is_completed:
            self.completion = self._complete(self.request_key, self.params, now_ms)


class DelayedOperationPurgatory:
    """Operations watched per partition, with deadlines in a heap."""

    def __init__(self, name: str) -> None:
        self.name = name
        # Per key, in the order watched: operations finish roughly in that order (the HW passes
        # them one after the other, deadlines come in order), so finished ones leave from the
        # front.
        self._watchers: dict[TopicPartition, deque[DelayedOperation]] = {}
        self._deadlines: list[tuple[int, int, DelayedOperation]] = []
        self._seq = 0
        self._pending = 0

    def __len__(self) -> int:
        return self._pending

    def try_complete_else_watch(self, op: DelayedOperation, now_ms: int) -> Completion | None:
        """Complete at once if possible (returns the completion), else watch it."""
        if op.try_complete(now_ms):
            return op.completion
        for key in op.keys:
            watchers = self._watchers.get(key)
            if watchers is None:
                self._watchers[key] = deque((op,))
                continue
            # Drop watches of operations finished elsewhere (expired, or through another key):
            # a key that sees no activity is never checked, and each idle follower fetch that
            # expires on it would otherwise stay in its list for good. Only from the front:
            # scanning the whole list on every watch costs quadratic time when a connection
            # pipelines many acks=all requests (hundreds wait on a partition at once), and a
            # finished operation behind a live one leaves once that one has finished (every
            # operation has a deadline).
            while watchers and watchers[0].is_completed:
                watchers.popleft()
            watchers.append(op)
        self._seq += 1
        heapq.heappush(self._deadlines, (op.deadline_ms, self._seq, op))
        self._pending += 1
        return None

    def check_and_complete(self, key: TopicPartition, now_ms: int) -> list[Completion]:
        ops = self._watchers.pop(key, None)
        if not ops:
            return []
        done: list[Completion] = []
        remaining: list[DelayedOperation] = []
        # The lowest offset an operation failed to reach on this key: the ones waiting on it
        # for as much or more cannot complete now either, and are not tried (acks=all
        # requests pipelined on one partition: hundreds wait, only the HW's first few finish).
        blocked: int | None = None
        for op in ops:
            if op.is_completed:
                continue  # finished through another key or expired; drop the stale watch
            if blocked is not None:
                at = op.pending_offset(key)
                if at is not None and at >= blocked:
                    remaining.append(op)
                    continue
            if op.try_complete(now_ms):
                self._pending -= 1
                assert op.completion is not None
                done.append(op.completion)
            else:
                remaining.append(op)
                at = op.pending_offset(key)
                if at is not None and (blocked is None or at < blocked):
                    blocked = at
        if remaining:
            # An op completed re-entrantly may have added new watches for this key meanwhile.
            self._watchers.setdefault(key, deque()).extend(remaining)
        return done

    def expire(self, now_ms: int) -> list[Completion]:
        done: list[Completion] = []
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            _, _, op = heapq.heappop(self._deadlines)
            if op.is_completed:
                continue
            op.expire_now(now_ms)
            self._pending -= 1
            assert op.completion is not None
            done.append(op.completion)
        return done

    def force_complete(self, match: Callable[[DelayedOperation], bool],
                       now_ms: int) -> list[Completion]:
        """Complete now every pending operation ``match`` picks (Kafka's forceComplete: it
        answers with what it has); their watches go as finished ones do."""
        done: list[Completion] = []
        for _, _, op in self._deadlines:
            if not op.is_completed and match(op):
                op.expire_now(now_ms)
                self._pending -= 1
                assert op.completion is not None
                done.append(op.completion)
        return done

    def next_deadline_ms(self) -> int | None:
        while self._deadlines and self._deadlines[0][2].is_completed:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def is_watched(self, key: TopicPartition) -> bool:
        """Whether operations (possibly already completed elsewhere) are watched on ``key``."""
        return key in self._watchers

    def watched_keys(self) -> list[TopicPartition]:
        return [k for k, ops in self._watchers.items() if any(not o.is_completed for o in ops)]
