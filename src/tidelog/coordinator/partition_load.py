"""Reading a coordinator's partition (``__consumer_offsets``, ``__transaction_state``) when this
broker becomes its leader: one scan for the group and the transaction coordinators."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from typing import Any

from tidelog.replication.types import TopicPartition

# Loading yields to the event loop after this many batches, so the broker serves meanwhile.
LOAD_BATCHES_PER_YIELD = 200


class LoadScan(enum.Enum):
    DONE = "done"
    SUPERSEDED = "superseded"  # a newer leadership (or a resignation) took the load over
    NOT_LEADER = "not leader"


async def scan_partition(
    core: Any,
    tp: TopicPartition,
    still_loading: Callable[[], bool],
    on_batch: Callable[[Any, int], bool],
) -> LoadScan:
    """Feed ``on_batch(batch, end_offset)`` the batches of ``tp``'s log from its start, with
    ``end_offset`` the log end when the scan began; ``on_batch`` returning False ends the scan.
    The first yield lets the LeaderAndIsr that elected this broker be answered first; after
    every yield the scan gives up once ``still_loading()`` is False."""
    await asyncio.sleep(0)
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
            await asyncio.sleep(0)
            if not still_loading():
                return LoadScan.SUPERSEDED
    return LoadScan.DONE
