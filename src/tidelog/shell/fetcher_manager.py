"""`ReplicaFetcherManager`: the follower side of a broker (Kafka's `AbstractFetcherManager` and
the loop of `AbstractFetcherThread`), one for both drivers.

Kafka runs `num.replica.fetchers` fetchers per source broker; a partition goes to fetcher
`abs(31 * topic.hashCode() + partition) % num.replica.fetchers` (`getFetcherId`). Each
(source broker, fetcher id) here is a `FetcherThread`: the pure `replication.ReplicaFetcher`
(truncation on the leader's diverging epoch or by OffsetsForLeaderEpoch, fetching, the error
table) and the `LeaderEndPoint` the driver made for it. Its loop, without a thread:

    pump: every request the fetcher has ready -> endpoint.send(request, on_done)
          then a timer at the fetcher's next wake-up (a back-off ending, a request timing out)
    on_done(response) -> fetcher.handle_response ; on_done(None) -> fetcher.on_request_failed
          then pump again at once (Kafka's thread goes from one fetch response to the next
          fetch: the leader learns of the append one network hop later)

A request that fails backs off only its own partitions (`replica.fetch.backoff.ms`); a partition
the fetcher marks failed (storage error, fencing) stops alone while the others go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tidelog.replication.config import ReplicationConfig
from tidelog.replication.fetcher import (
    FetcherRequest,
    LogLookup,
    PartitionFetchState,
    ReplicaFetcher,
)
from tidelog.replication.types import AddFetcher, FetcherAction, RemoveFetcher, TopicPartition
from tidelog.shell.interfaces import (
    LeaderEndPoint,
    LeaderEndPointFactory,
    ScheduledTask,
    Scheduler,
    Time,
)
from tidelog.utils import java_string_hash

__all__ = ["FetcherThread", "ReplicaFetcherManager", "fetcher_id_for", "java_string_hash"]

logger = logging.getLogger(__name__)


def fetcher_id_for(tp: TopicPartition, num_fetchers: int) -> int:
    """Kafka's `getFetcherId`: `Utils.abs(31 * topic.hashCode + partition) % numFetchers`."""
    if num_fetchers <= 1:
        return 0
    v = (31 * java_string_hash(tp.topic) + tp.partition) & 0xFFFFFFFF
    v = v - (1 << 32) if v >= 1 << 31 else v
    v = 0 if v == -(1 << 31) else abs(v)
    return v % num_fetchers


class FetcherThread:
    """One (source broker, fetcher id): a `ReplicaFetcher` and the endpoint it talks through."""

    __slots__ = ("_manager", "_wake", "_wake_at", "endpoint", "fetcher", "fetcher_id",
                 "source_broker", "stopped")

    def __init__(self, manager: ReplicaFetcherManager, source_broker: int, fetcher_id: int,
                 fetcher: ReplicaFetcher, endpoint: LeaderEndPoint) -> None:
        self._manager = manager
        self.source_broker = source_broker
        self.fetcher_id = fetcher_id
        self.fetcher = fetcher
        self.endpoint = endpoint
        self.stopped = False
        self._wake: ScheduledTask | None = None
        self._wake_at = 0

    @property
    def name(self) -> str:
        return f"ReplicaFetcher-{self.fetcher_id}-{self.source_broker}"

    def pump(self) -> None:
        """Send what is ready, then sleep until the fetcher's next wake-up."""
        if self.stopped:
            return
        m = self._manager
        now = m.time.milliseconds()
        for request in self.fetcher.poll_requests(now):
            self.endpoint.send(request, lambda response, r=request: self._on_done(r, response))
        wake = self.fetcher.next_wakeup_ms(now)
        if wake is None or (self._wake is not None and self._wake_at <= wake):
            return
        if self._wake is not None:
            self._wake.cancel()
        self._wake_at = wake
        self._wake = m.scheduler.schedule(self.name, self._on_wake, wake - now)

    def _on_wake(self) -> None:
        self._wake = None
        self.pump()

    def _on_done(self, request: FetcherRequest, response: Any | None) -> None:
        if self.stopped:
            return
        now = self._manager.time.milliseconds()
        if response is None:
            self.fetcher.on_request_failed(request, now)
        else:
            try:
                result = self.fetcher.handle_response(request, response, now)
            except Exception:  # one bad response never stops the fetcher
                logger.exception("%s: handling a %s response failed", self.name,
                                 type(request).__name__)
                self.fetcher.on_request_failed(request, now)
                result = None
            if result is not None and result.failed:
                logger.warning("%s: partitions failed: %s", self.name,
                               sorted(map(str, result.failed)))
            if result is not None and result.new_high_watermark:
                self._manager.on_new_high_watermarks(result.new_high_watermark)
        self._manager.on_progress()
        self.pump()

    def stop(self) -> None:
        self.stopped = True
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        self.endpoint.close()


class ReplicaFetcherManager:
    def __init__(
        self,
        broker_id: int,
        logs: LogLookup,
        config: ReplicationConfig,
        *,
        time: Time,
        scheduler: Scheduler,
        leader_end_point: LeaderEndPointFactory,
        num_fetchers: int = 1,
        broker_epoch: int = -1,
        on_progress: Callable[[], None] | None = None,
        on_new_high_watermarks: Callable[[list[TopicPartition]], None] | None = None,
    ) -> None:
        """``on_progress``: after each response handled; ``on_new_high_watermarks``: before
        it, with the partitions whose follower HW that response moved."""
        self.broker_id = broker_id
        self.config = config
        self.time = time
        self.scheduler = scheduler
        self.num_fetchers = max(1, num_fetchers)
        self.broker_epoch = broker_epoch
        self._logs = logs
        self._leader_end_point = leader_end_point
        self._on_progress = on_progress
        self._on_new_high_watermarks = on_new_high_watermarks
        self.fetchers: dict[tuple[int, int], FetcherThread] = {}
        self._source_of: dict[TopicPartition, tuple[int, int]] = {}
        self._request_ids = 0

    def on_progress(self) -> None:
        if self._on_progress is not None:
            self._on_progress()

    def on_new_high_watermarks(self, partitions: list[TopicPartition]) -> None:
        if self._on_new_high_watermarks is not None:
            self._on_new_high_watermarks(partitions)

    def set_broker_epoch(self, broker_epoch: int) -> None:
        self.broker_epoch = broker_epoch
        for thread in self.fetchers.values():
            thread.fetcher.broker_epoch = broker_epoch

    # ------------------------------------------------------------------ Kafka's API
    def apply(self, actions: Iterable[FetcherAction]) -> None:
        """Carry out the core's AddFetcher / RemoveFetcher actions, in order."""
        touched: dict[tuple[int, int], FetcherThread] = {}
        for action in actions:
            if isinstance(action, RemoveFetcher):
                self.remove_fetcher_for_partitions([action.tp])
            elif isinstance(action, AddFetcher):
                thread = self._add(action.tp, action.source_broker, action.fetch_offset,
                                   action.leader_epoch)
                touched[(thread.source_broker, thread.fetcher_id)] = thread
        for thread in touched.values():
            thread.pump()

    def add_fetcher_for_partitions(
        self, partitions: Mapping[TopicPartition, tuple[int, int, int]]
    ) -> None:
        """``{tp: (source broker, fetch offset, leader epoch)}``: start replicating them."""
        self.apply([AddFetcher(tp, source, offset, epoch)
                    for tp, (source, offset, epoch) in partitions.items()])

    def _add(self, tp: TopicPartition, source: int, fetch_offset: int,
             leader_epoch: int) -> FetcherThread:
        key = (source, fetcher_id_for(tp, self.num_fetchers))
        old = self._source_of.get(tp)
        if old is not None and old != key:
            self.remove_fetcher_for_partitions([tp])
        thread = self.fetchers.get(key)
        if thread is None:
            # Distinct id ranges per fetcher keep request ids unique on this broker.
            self._request_ids += 1
            fetcher = ReplicaFetcher(
                self.broker_id, source, self._logs, self.config,
                broker_epoch=self.broker_epoch, first_request_id=self._request_ids << 32,
            )
            thread = FetcherThread(self, source, key[1], fetcher,
                                   self._leader_end_point(source, key[1]))
            self.fetchers[key] = thread
        thread.fetcher.add_partitions({tp: (fetch_offset, leader_epoch)},
                                      self.time.milliseconds())
        self._source_of[tp] = key
        return thread

    def remove_fetcher_for_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            key = self._source_of.pop(tp, None)
            if key is not None and key in self.fetchers:
                self.fetchers[key].fetcher.remove_partitions([tp])

    def resize(self, num_fetchers: int) -> None:
        """Kafka's resizeThreadPool (num.replica.fetchers changed live): every partition leaves
        its fetcher and is added again under the new count (the hash placement, as Kafka does),
        at the fetch offset and leader epoch it had; fetchers left idle stop."""
        num_fetchers = max(1, num_fetchers)
        if num_fetchers == self.num_fetchers:
            return
        moved: list[FetcherAction] = []
        for tp, (source, _) in sorted(self._source_of.items()):
            state = self.fetch_state(tp)
            if state is not None:
                moved.append(AddFetcher(tp, source, state.fetch_offset,
                                        state.current_leader_epoch))
        self.remove_fetcher_for_partitions([a.tp for a in moved if isinstance(a, AddFetcher)])
        self.num_fetchers = num_fetchers
        self.apply(moved)
        self.shutdown_idle_fetcher_threads()

    def shutdown_idle_fetcher_threads(self) -> None:
        for key in [k for k, t in self.fetchers.items() if t.fetcher.is_idle]:
            self.fetchers.pop(key).stop()

    def shutdown(self) -> None:
        threads = list(self.fetchers.values())
        self.fetchers.clear()
        self._source_of.clear()
        for t in threads:
            t.stop()

    # ------------------------------------------------------------------ views
    def source_of(self, tp: TopicPartition) -> int | None:
        key = self._source_of.get(tp)
        return None if key is None else key[0]

    def fetch_state(self, tp: TopicPartition) -> PartitionFetchState | None:
        key = self._source_of.get(tp)
        if key is None or key not in self.fetchers:
            return None
        return self.fetchers[key].fetcher.partition_states.state_value(tp)

    @property
    def failed_partitions(self) -> set[TopicPartition]:
        out: set[TopicPartition] = set()
        for t in self.fetchers.values():
            out |= t.fetcher.failed_partitions
        return out
