"""A blocking facade over tidelog's asyncio :class:`~tidelog.client.cluster.KafkaClient`.

Spark calls a data source synchronously (``partitions()``, ``latestOffset()``, ``read()``), in
Python worker processes that run no event loop, so each :class:`SyncKafka` owns a private loop
and runs the client's coroutines on it. It is opened lazily where it is used (driver-side
planning, or inside ``read()`` on an executor) and never pickled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from tidelog.client.cluster import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    FetchResult,
    KafkaClient,
)
from tidelog.client.errors import BrokerResponseError, KafkaClientError
from tidelog.client.metadata import TopicPartition
from tidelog.protocol.errors import ErrorCode
from tidelog.spark.options import Subscription

__all__ = ["KafkaOffsetError", "SyncKafka"]

T = TypeVar("T")


class KafkaOffsetError(RuntimeError):
    """Offsets could not be resolved (after the configured retries)."""


class SyncKafka:
    """Blocking calls on one KafkaClient; close() when done."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        client_id: str = "tidelog-spark",
        request_timeout_ms: int = 30000,
        offsets_timeout_ms: int = 60000,
        read_committed: bool = False,
    ) -> None:
        self.offsets_timeout_ms = offsets_timeout_ms
        # READ_COMMITTED (KIP-98): latest offsets are the LSO, fetches stop there and carry the
        # aborted transactions to skip (client/read_committed.py).
        self.isolation_level = 1 if read_committed else 0
        self._loop = asyncio.new_event_loop()
        self.client = KafkaClient(
            bootstrap_servers, client_id=client_id, request_timeout_ms=request_timeout_ms
        )
        self._started = False

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._started:
            self._started = True
            self._loop.run_until_complete(self.client.start())
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._loop.run_until_complete(self.client.close())
        finally:
            self._loop.close()

    def __enter__(self) -> SyncKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- topics ---------------------------------------------------------------------------

    def topic_partitions(self, subscription: Subscription) -> list[TopicPartition]:
        """The partitions the subscription covers now (sorted). Topics that do not exist
        (yet) contribute nothing, as with Spark's subscribe; assign lists its own."""
        if subscription.kind == "assign":
            return sorted(subscription.partitions)
        if subscription.kind == "subscribe":
            metadata = self.run(self.client.refresh_metadata(list(subscription.topics)))
            topics = [t for t in subscription.topics if t in metadata.topics]
        else:
            metadata = self.run(self.client.refresh_metadata(None))
            topics = [t for t in metadata.topics if subscription.matches(t)]
        result: list[TopicPartition] = []
        for topic in topics:
            meta = metadata.topics[topic]
            if meta.error != ErrorCode.NONE:
                continue
            result.extend(TopicPartition(topic, p) for p in meta.partitions)
        return sorted(result)

    # -- offsets --------------------------------------------------------------------------

    def earliest_offsets(
        self, tps: Iterable[TopicPartition], *, retries: int = 3, retry_interval_ms: int = 10
    ) -> dict[TopicPartition, int]:
        """Each partition's log start offset."""
        return self._list_offsets(tps, EARLIEST_TIMESTAMP, retries, retry_interval_ms)

    def latest_offsets(
        self, tps: Iterable[TopicPartition], *, retries: int = 3, retry_interval_ms: int = 10
    ) -> dict[TopicPartition, int]:
        """Each partition's high watermark (the last stable offset when reading committed):
        the end of what is committed, exclusive.

        ListOffsets(LATEST) answers the HW (LSO) in Kafka. A zero-wait Fetch at that offset
        reports it too, and the larger of the two is taken: some Kafka-compatible brokers
        (tansu 0.6) answer ListOffsets with the last batch's base offset + 1, short of the HW.
        """
        tps = list(tps)
        listed = self._list_offsets(tps, LATEST_TIMESTAMP, retries, retry_interval_ms)
        by_leader: dict[int, dict[TopicPartition, int]] = {}
        for tp, offset in listed.items():
            leader = self.client.leader_for(tp)
            if leader is not None:
                by_leader.setdefault(leader, {})[tp] = offset
        for leader, wanted in by_leader.items():
            try:
                _, _, results = self.run(
                    self.client.fetch_from(
                        # min_bytes=0 answers at once; max_wait_ms=1, not 0, as tansu 0.6
                        # answers a zero wait with no partitions at all
                        leader,
                        wanted,
                        max_wait_ms=1,
                        min_bytes=0,
                        partition_max_bytes=1,
                        isolation_level=self.isolation_level,
                    )
                )
            except KafkaClientError:
                continue  # the ListOffsets answer stands
            for tp, result in results.items():
                end = result.last_stable_offset if self.isolation_level else result.high_watermark
                if result.error == ErrorCode.NONE and end > listed[tp]:
                    listed[tp] = end
        return listed

    def offsets_for_times(
        self,
        timestamps: Mapping[TopicPartition, int],
        *,
        retries: int = 3,
        retry_interval_ms: int = 10,
    ) -> dict[TopicPartition, int]:
        """Per partition, the first offset whose timestamp is >= the given one (ms); -1 where
        no record is that recent (ListOffsets by timestamp, as Kafka's offsetsForTimes)."""
        return self._list_offsets(timestamps, None, retries, retry_interval_ms)

    def _list_offsets(
        self,
        tps: Iterable[TopicPartition] | Mapping[TopicPartition, int],
        timestamp: int | None,
        retries: int,
        retry_interval_ms: int,
    ) -> dict[TopicPartition, int]:
        if timestamp is None:
            assert isinstance(tps, Mapping)
            wanted = dict(tps)
        else:
            wanted = {tp: timestamp for tp in tps}
        if not wanted:
            return {}
        last_error = ""
        # Retriable errors (a leader election in progress) are retried until the deadline, as
        # Kafka's consumer blocks up to default.api.timeout.ms; others `retries` times.
        deadline = time.monotonic() + self.offsets_timeout_ms / 1000
        attempt = 0
        while True:
            answers = self.run(self.client.list_offsets(
                wanted, isolation_level=self.isolation_level))
            failed = {tp: a for tp, a in answers.items() if a.error != ErrorCode.NONE}
            if not failed:
                if timestamp is None:
                    # No record that recent: Kafka answers offset -1 and timestamp -1; tansu 0.6
                    # answers offset 0 with timestamp -1. A real match has its timestamp.
                    return {
                        tp: a.offset if a.offset >= 0 and a.timestamp >= 0 else -1
                        for tp, a in answers.items()
                    }
                return {tp: a.offset for tp, a in answers.items()}
            last_error = ", ".join(f"{tp}: {_name(a.error)}" for tp, a in sorted(failed.items()))
            retriable = all(_retriable(a.error) for a in failed.values())
            attempt += 1
            if attempt > retries and not (retriable and time.monotonic() < deadline):
                break
            time.sleep(max(retry_interval_ms, 100 if attempt > retries else 0) / 1000)
            self._refresh_quietly({tp.topic for tp in failed})
        which = {EARLIEST_TIMESTAMP: "earliest", LATEST_TIMESTAMP: "latest"}.get(
            timestamp if timestamp is not None else 0, "timestamp"
        )
        raise KafkaOffsetError(f"could not get the {which} offsets ({last_error})")

    def _refresh_quietly(self, topics: Iterable[str]) -> None:
        try:
            self.run(self.client.refresh_metadata(list(topics)))
        except KafkaClientError:
            pass

    # -- data -----------------------------------------------------------------------------

    def fetch(
        self, tp: TopicPartition, offset: int, *, max_bytes: int, max_wait_ms: int = 100
    ) -> FetchResult:
        """One partition's records from its leader (the client follows leader moves)."""
        try:
            return self.run(
                self.client.fetch(tp, offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms,
                                  isolation_level=self.isolation_level)
            )
        except BrokerResponseError as exc:
            return FetchResult(exc.code_value)
        except KafkaClientError:
            return FetchResult(ErrorCode.NETWORK_EXCEPTION)


def _retriable(code: int) -> bool:
    try:
        return ErrorCode(code).retriable
    except ValueError:
        return False


def _name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)
