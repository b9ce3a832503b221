"""Reading a coordinator's partition (``__consumer_offsets``, ``__transaction_state``) when this
broker becomes its leader: one scan and one retry policy for the group and the transaction
coordinators.

A failed read (an I/O error) is retried from the partition's start with a fresh sink, up to
``LoadRetry.attempts`` times; the partition is never served half read (committed offsets or a
transaction's state would go back). After the last attempt the load is FAILED and the caller
stops loading the partition: requests get NOT_COORDINATOR, as from Kafka's CoordinatorRuntime
in its FAILED state, until the next leadership loads it again. (Kafka itself does not retry:
CoordinatorRuntime fails the load at once, and the ZooKeeper-era TransactionStateManager logs
the error and serves what it read.)"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from tidelog.replication.types import TopicPartition

__all__ = ["DEFAULT_LOAD_RETRY", "LOAD_BATCHES_PER_YIELD", "BatchSink", "LoadRetry", "LoadScan",
           "load_partition", "scan_partition"]

logger = logging.getLogger(__name__)

# Loading yields to the event loop after this many batches, so the broker serves meanwhile.
LOAD_BATCHES_PER_YIELD = 200


class LoadScan(enum.Enum):
    DONE = "done"
    SUPERSEDED = "superseded"  # a newer leadership (or a resignation) took the load over
    NOT_LEADER = "not leader"
    FAILED = "failed"  # every attempt failed to read the log


@dataclass(frozen=True, slots=True)
class LoadRetry:
    """Attempts of a load and the wait before attempt n+1 (``backoff_ms * n``)."""

    attempts: int = 5
    backoff_ms: int = 1000

    def delay_ms(self, failed_attempt: int) -> int | None:
        """The wait after attempt ``failed_attempt`` (1-based) failed; None: no more attempts."""
        if failed_attempt >= self.attempts:
            return None
        return self.backoff_ms * failed_attempt


DEFAULT_LOAD_RETRY = LoadRetry()


class BatchSink(Protocol):
    def add_batch(self, batch: Any, end_offset: int) -> bool:
        """Take one batch of the partition; False ends the scan."""
        ...


S = TypeVar("S", bound=BatchSink)


async def _asyncio_sleep_ms(ms: int) -> None:
    await asyncio.sleep(ms / 1000)


async def scan_partition(
    core: Any,
    tp: TopicPartition,
    still_loading: Callable[[], bool],
    on_batch: Callable[[Any, int], bool],
    sleep_ms: Callable[[int], Awaitable[None]] = _asyncio_sleep_ms,
) -> LoadScan:
    """Feed ``on_batch(batch, end_offset)`` the batches of ``tp``'s log from its start, with
    ``end_offset`` the log end when the scan began; ``on_batch`` returning False ends the scan.
    The first yield lets the LeaderAndIsr that elected this broker be answered first; after
    every yield the scan gives up once ``still_loading()`` is False. A read error propagates.
    ``sleep_ms``: the driver's sleep (asyncio's, or the simulator's virtual time)."""
    await sleep_ms(0)
    if not still_loading():
        return LoadScan.SUPERSEDED
    p = core.partition(tp)
    if p is None or not p.is_leader:
        return LoadScan.NOT_LEADER
    end_offset = p.log_end_offset
    for i, batch in enumerate(p.log.batches(p.log.log_start_offset)):
        if not on_batch(batch, end_offset):
            break
        if i % LOAD_BATCHES_PER_YIELD == LOAD_BATCHES_PER_YIELD - 1:
            await sleep_ms(0)
            if not still_loading():
                return LoadScan.SUPERSEDED
    return LoadScan.DONE


async def load_partition(
    core: Any,
    tp: TopicPartition,
    still_loading: Callable[[], bool],
    new_sink: Callable[[], S],
    retry: LoadRetry = DEFAULT_LOAD_RETRY,
    sleep_ms: Callable[[int], Awaitable[None]] = _asyncio_sleep_ms,
) -> tuple[LoadScan, S]:
    """Scan ``tp`` into a sink from ``new_sink()``, again into a fresh one after a read error
    (``retry``'s attempts and waits). Returns how it ended and the last attempt's sink, whole
    only when DONE."""
    attempt = 1
    while True:
        sink = new_sink()
        try:
            return await scan_partition(core, tp, still_loading, sink.add_batch, sleep_ms), sink
        except Exception as e:
            delay_ms = retry.delay_ms(attempt)
            logger.error("loading %s failed (attempt %d of %d): %s", tp, attempt, retry.attempts,
                         e)
            if delay_ms is None:
                return LoadScan.FAILED, sink
        await sleep_ms(delay_ms)
        if not still_loading():
            return LoadScan.SUPERSEDED, sink
        attempt += 1
