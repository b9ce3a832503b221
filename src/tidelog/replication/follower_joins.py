"""Followers joining partitions this broker has just come to lead (beyond Kafka).

A follower adds a new partition to its fetch only when the fetch it has in flight to the leader
returns, and the leader holds that fetch up to ``replica.fetch.wait.max.ms`` when nothing it
names changes. In Kafka (AbstractFetcherThread, DelayedFetch) a new topic's or a moved
leadership's followers therefore join up to that long late, and the first acks=all produces
wait for them. Here the leader does two things for each remote replica F of a partition P it
has just come to lead:

- **wake**: F's held fetches that do not name P are answered at once (with what they have), so
  F's next fetch can carry P (``take_started`` gives the shell which ones to wake);
- **short holds**: F may not have had its own LeaderAndIsr yet, so its next fetch may still
  lack P. A follower fetch lacking a partition its sender is joining is held only a slice of
  its wait (1/``JOIN_WAIT_SLICES``), so F's fetch after it learns of P follows within that
  slice. Bounded, so a follower that never learns (its LeaderAndIsr failed) does not spin: at
  most ``JOIN_WAIT_SLICES`` short holds per follower after its last new partition (together
  about one ordinary wait), and none after ``replica.lag.time.max.ms`` (by then the follower
  leaves the ISR anyway).

A partition stops being awaited once a held fetch of F names it, or when this broker no longer
leads it with F as a replica. Pure: the caller passes the time.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field

from tidelog.replication.types import TopicPartition

__all__ = ["JOIN_WAIT_SLICES", "FollowerJoins"]

# A joining follower's fetch lacking its new partition waits max_wait / JOIN_WAIT_SLICES, and at
# most JOIN_WAIT_SLICES of its fetches are cut so: together about one ordinary wait.
JOIN_WAIT_SLICES = 50

# leads(tp, replica_id): this broker leads tp and replica_id is one of its remote replicas.
LeadsFor = Callable[[TopicPartition, int], bool]


@dataclass(slots=True)
class _Joining:
    until_ms: int
    short_holds_left: int
    partitions: dict[TopicPartition, None] = field(default_factory=dict)


class FollowerJoins:
    def __init__(self, window_ms: int) -> None:
        """``window_ms``: how long after its last new partition a follower's fetches may be
        held short (``replica.lag.time.max.ms``)."""
        self.window_ms = window_ms
        self._joining: dict[int, _Joining] = {}
        # Started since the last take_started: replica id -> its new partitions.
        self._started: dict[int, list[TopicPartition]] = {}

    def started(self, tp: TopicPartition, replicas: Iterable[int], now_ms: int) -> None:
        """This broker has just come to lead ``tp``; ``replicas``: its remote replicas."""
        for replica_id in replicas:
            j = self._joining.get(replica_id)
            if j is None:
                j = self._joining[replica_id] = _Joining(0, 0)
            elif now_ms >= j.until_ms:
                j.partitions.clear()  # a follower that has not fetched since (gone)
            j.until_ms = now_ms + self.window_ms
            j.short_holds_left = JOIN_WAIT_SLICES
            j.partitions[tp] = None
            self._started.setdefault(replica_id, []).append(tp)

    def take_started(self) -> dict[int, list[TopicPartition]]:
        """The partitions each follower started joining since the last call: the held fetches
        of that follower not naming one of them are to be answered now."""
        out, self._started = self._started, {}
        return out

    def fetch_wait_ms(self, replica_id: int, max_wait_ms: int,
                      fetching: Container[TopicPartition], leads: LeadsFor, now_ms: int) -> int:
        """How long to hold a fetch of follower ``replica_id`` that names ``fetching`` (for a
        fetch session: every partition the session holds) and asks to wait ``max_wait_ms``.
        Call it only for a fetch about to be held: a cut hold counts against the bound."""
        j = self._joining.get(replica_id)
        if j is None or max_wait_ms <= 0:
            return max_wait_ms
        if now_ms >= j.until_ms or j.short_holds_left <= 0:
            del self._joining[replica_id]
            return max_wait_ms
        for tp in [tp for tp in j.partitions if tp in fetching or not leads(tp, replica_id)]:
            del j.partitions[tp]
        if not j.partitions:
            del self._joining[replica_id]
            return max_wait_ms
        j.short_holds_left -= 1
        return min(max_wait_ms, max(1, max_wait_ms // JOIN_WAIT_SLICES))
