"""Fetch sessions (KIP-227): Kafka's ``FetchManager``, ``FetchSessionCache`` and fetch contexts.

A fetch with session epoch 0 (``INITIAL_EPOCH``) is full: it lists every partition and, when the
cache has a slot (or can evict one), the response carries a new session id. The fetcher then sends
incremental fetches (epoch 1, 2, ...) listing only the partitions whose fetch parameters changed
plus ``forgotten_topics_data``; the broker answers only the partitions with something new
(records, a HW or log start offset change, an error). Epoch -1 (``FINAL_EPOCH``) is a
sessionless full fetch; a full fetch naming a session closes it.

Change tracking (beyond Kafka, which reads every session partition per fetch): an incremental
fetch reads only the partitions it lists and the session's *dirty* ones. ``FetchManager.
mark_changed(tp)`` (the broker calls it whenever the replica manager reports a change of a
partition: append, HW, leadership, ISR, log start) marks ``tp`` dirty in every session holding
it and wakes a fetch of that session held for ``min_bytes``. A read partition becomes clean
again only when its read settled: nothing to answer, no records read in the whole fetch (so no
``max_bytes`` cut-off can hide data), and the broker did not name it unsettled (not led here,
throttled). A new session starts with every partition dirty. So an idle incremental fetch costs
O(changed partitions), not O(session).

Errors as Kafka: an unknown session id -> FETCH_SESSION_ID_NOT_FOUND (70), an epoch other than
the session's -> INVALID_FETCH_SESSION_EPOCH (71), both with no partitions.

Eviction (``FetchSessionCache.try_evict``): a new session may take the slot of an existing one if
that one is stale (unused for ``eviction_ms``), or else the least valuable evictable session by
(privileged, size, id) is less valuable than the new one. Follower sessions are privileged; a
session is evictable by a privileged newcomer when unprivileged or older than ``eviction_ms``,
and by anyone only when older than ``eviction_ms`` (so a new session is not evicted at once).

Topic ids (KIP-516, Kafka's CachedPartition): a session opened by Fetch v13+ keys its
partitions by (topic id, partition) (``TopicIdPartition``), one opened by v12 or older by name
(``TopicPartition``); a request of the other kind in a session is FETCH_SESSION_TOPIC_ID_ERROR
(76). In a session by id, a partition keeps the name its id resolved to when it joined (an id
unknown then is resolved at a later fetch, ``topic_names``): a topic deleted and re-created under
the same name is another partition, which the broker answers INCONSISTENT_TOPIC_ID while the
session still names the old id.

The cache never reads a clock: every call takes ``now_ms``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple
from uuid import UUID

from tidelog.protocol.errors import ErrorCode
from tidelog.replication.types import TopicPartition

__all__ = [
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "INVALID_SESSION_ID",
    "MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS",
    "CachedPartition",
    "FetchContext",
    "FetchManager",
    "FetchSession",
    "FetchSessionCache",
    "FullFetchContext",
    "IncrementalFetchContext",
    "PartitionResponse",
    "SessionErrorContext",
    "SessionKey",
    "SessionlessFetchContext",
    "TopicIdPartition",
    "next_epoch",
    "resolve",
]

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
# Kafka's KafkaServer.MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS (not configurable there either).
MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS = 120_000
_INT_MAX = 2**31 - 1

# Request data of one partition: (fetch offset, current leader epoch, log start offset, max bytes,
# last fetched epoch) — the tuple ReplicaManager.fetch_messages takes.
PartitionRequest = tuple[int, int, int, int, int]


class TopicIdPartition(NamedTuple):
    """A partition named by topic id (Fetch v13+): the key of a session by id."""

    topic_id: UUID
    partition: int


# A session partition: by name (Fetch v12 and older) or by topic id (v13+).
SessionKey = TopicPartition | TopicIdPartition


def resolve(key: SessionKey, topic_names: Mapping[UUID, str]) -> TopicPartition | None:
    """The partition ``key`` names, None for a topic id not in ``topic_names``."""
    if isinstance(key, TopicIdPartition):
        name = topic_names.get(key.topic_id)
        return None if name is None else TopicPartition(name, key.partition)
    return key


def next_epoch(epoch: int) -> int:
    """Kafka's ``FetchMetadata.nextEpoch``: wraps from INT_MAX to 1, negative stays final."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == _INT_MAX else epoch + 1


def is_full(epoch: int) -> bool:
    return epoch in (INITIAL_EPOCH, FINAL_EPOCH)


@dataclass(frozen=True, slots=True)
class PartitionResponse:
    """What the session needs of one partition's response."""

    error: int
    high_watermark: int
    log_start_offset: int
    records_size: int
    preferred_read_replica: int = -1  # KIP-392: the follower the consumer should fetch from
    diverging: bool = False  # a diverging epoch is answered (KIP-320/595)


class CachedPartition:
    __slots__ = ("fetch_offset", "fetcher_log_start_offset", "high_watermark",
                 "last_fetched_epoch", "leader_epoch", "local_log_start_offset", "max_bytes",
                 "req_data", "seq", "tp")

    def __init__(self, req: PartitionRequest, resp: PartitionResponse | None = None,
                 tp: TopicPartition | None = None) -> None:
        self.seq = 0  # place in the session's read order (set by the session)
        # The partition it names; None while its topic id is unknown (Kafka's null topic name).
        self.tp = tp
        self.update_request_params(req)
        self.high_watermark = -1 if resp is None else resp.high_watermark
        self.local_log_start_offset = -1 if resp is None else resp.log_start_offset

    def update_request_params(self, req: PartitionRequest) -> None:
        # The tuple is kept as well: every incremental fetch hands all of them to the read.
        self.req_data: PartitionRequest = req
        (self.fetch_offset, self.leader_epoch, self.fetcher_log_start_offset, self.max_bytes,
         self.last_fetched_epoch) = req

    def maybe_update_response_data(self, resp: PartitionResponse, update: bool) -> bool:
        """Kafka's ``maybeUpdateResponseData``: must this partition be in the response?"""
        must_respond = resp.records_size > 0
        if self.high_watermark != resp.high_watermark:
            must_respond = True
            if update:
                self.high_watermark = resp.high_watermark
        if self.local_log_start_offset != resp.log_start_offset:
            must_respond = True
            if update:
                self.local_log_start_offset = resp.log_start_offset
        if resp.preferred_read_replica >= 0:
            must_respond = True
        if resp.diverging:
            must_respond = True  # for the fetcher to truncate
        if resp.error != ErrorCode.NONE:
            # An invalid cached HW makes the partition be sent again once the error is gone.
            if update:
                self.high_watermark = -1
            must_respond = True
        return must_respond


class FetchSession:
    def __init__(self, session_id: int, privileged: bool,
                 partitions: dict[SessionKey, CachedPartition], now_ms: int,
                 replica_id: int = -1, uses_topic_ids: bool = False) -> None:
        self.id = session_id
        self.privileged = privileged
        self.replica_id = replica_id
        # Opened by Fetch v13+: keyed by TopicIdPartition, else by TopicPartition.
        self.uses_topic_ids = uses_topic_ids
        # The read order is by ``seq``; a partition that answered moves to the end.
        self.partitions = partitions
        # The keys naming each partition (more than one only for the ids of a re-created topic).
        self.keys_by_tp: dict[TopicPartition, tuple[SessionKey, ...]] = {}
        # Keys whose topic id was unknown when they joined (resolved at a later fetch).
        self.unresolved: dict[SessionKey, None] = {}
        self._seq = 0
        for key, cached in partitions.items():
            self._move_to_end(cached)
            self._index(key, cached)
        # Partitions to read at the next fetch (every one at first: see the module docstring).
        self.dirty: dict[SessionKey, None] = dict.fromkeys(partitions)
        # Called with a partition's keys when it turns dirty (a held fetch of this session
        # waits on it).
        self.waker: Callable[[tuple[SessionKey, ...]], None] | None = None
        self.creation_ms = now_ms
        self.last_used_ms = now_ms
        # The arrival of the fetch before the last one: when the partitions read now were last
        # known unchanged (ReplicaManager.replay_follower_fetches).
        self.previous_used_ms = now_ms
        self.epoch = next_epoch(INITIAL_EPOCH)
        self.cached_size = -1  # the size the cache last accounted for; -1: not in the cache
        self.evictable_by_all = False
        self.evictable_by_privileged = False

    @property
    def size(self) -> int:
        return len(self.partitions)

    def evictable_key(self) -> tuple[bool, int, int]:
        return (self.privileged, self.cached_size, self.id)

    def _move_to_end(self, cached: CachedPartition) -> None:
        self._seq += 1
        cached.seq = self._seq

    def _index(self, key: SessionKey, cached: CachedPartition) -> TopicPartition | None:
        """Index ``key`` under its partition; the partition when it is newly held."""
        tp = cached.tp
        if tp is None:
            self.unresolved[key] = None
            return None
        keys = self.keys_by_tp.get(tp)
        self.keys_by_tp[tp] = (key,) if keys is None else (*keys, key)
        return tp if keys is None else None

    def _unindex(self, key: SessionKey, cached: CachedPartition) -> TopicPartition | None:
        """Drop ``key`` from the index; its partition when no other key holds it."""
        tp = cached.tp
        if tp is None:
            self.unresolved.pop(key, None)
            return None
        keys = tuple(k for k in self.keys_by_tp.get(tp, ()) if k != key)
        if keys:
            self.keys_by_tp[tp] = keys
            return None
        self.keys_by_tp.pop(tp, None)
        return tp

    def topic_partition(self, key: SessionKey) -> TopicPartition | None:
        cached = self.partitions.get(key)
        return None if cached is None else cached.tp

    def mark_dirty(self, tp: TopicPartition) -> None:
        keys = self.keys_by_tp.get(tp)
        if not keys:
            return
        dirty = self.dirty
        for key in keys:
            dirty[key] = None
        # Every change, also of a partition dirty already: a follower's held fetch waits
        # while its partitions' HW alone changed, and must wake for their next records.
        if self.waker is not None:
            self.waker(keys)

    def take_dirty(self) -> dict[SessionKey, PartitionRequest]:
        """The dirty partitions' request data in read order; they count as clean from now on
        (a change during the read marks them again)."""
        partitions = self.partitions
        keys = sorted((key for key in self.dirty if key in partitions),
                      key=lambda key: partitions[key].seq)
        self.dirty.clear()
        return {key: partitions[key].req_data for key in keys}

    def clean_partitions(self) -> list[TopicPartition]:
        """The partitions not dirty (O(session): for the periodic ISR check only)."""
        dirty = self.dirty
        return [cached.tp for key, cached in self.partitions.items()
                if key not in dirty and cached.tp is not None]

    def update(self, fetch_data: Mapping[SessionKey, PartitionRequest],
               to_forget: Iterable[SessionKey], topic_names: Mapping[UUID, str]
               ) -> tuple[list[TopicPartition], list[TopicPartition]]:
        """Kafka's ``FetchSession.update``: (partitions newly held, partitions let go)."""
        held, released = [], []
        for key, req in fetch_data.items():
            cached = self.partitions.get(key)
            if cached is None:
                cached = self.partitions[key] = CachedPartition(
                    req, tp=resolve(key, topic_names))
                self._move_to_end(cached)
                if (tp := self._index(key, cached)) is not None:
                    held.append(tp)
            else:
                cached.update_request_params(req)
            self.dirty[key] = None  # a listed partition is read
        for key in to_forget:
            cached = self.partitions.pop(key, None)
            if cached is not None:
                self.dirty.pop(key, None)
                if (tp := self._unindex(key, cached)) is not None:
                    released.append(tp)
        return held, released

    def resolve_names(self, topic_names: Mapping[UUID, str]) -> list[TopicPartition]:
        """Kafka's ``maybeResolveUnknownName``: name the partitions whose topic id is now known;
        the partitions newly held."""
        held = []
        for key in [k for k in self.unresolved if isinstance(k, TopicIdPartition)
                    and k.topic_id in topic_names]:
            del self.unresolved[key]
            cached = self.partitions[key]
            cached.tp = resolve(key, topic_names)
            if (tp := self._index(key, cached)) is not None:
                held.append(tp)
        return held


class FetchSessionCache:
    def __init__(self, max_entries: int,
                 eviction_ms: int = MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS,
                 rng: random.Random | None = None) -> None:
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        self._rng = rng or random.Random()
        self.sessions: dict[int, FetchSession] = {}
        self.num_partitions = 0
        self.evictions = 0
        # Which sessions hold a partition (FetchManager.mark_changed).
        self.holders: dict[TopicPartition, dict[FetchSession, None]] = {}

    def hold(self, session: FetchSession, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self.holders.setdefault(tp, {})[session] = None

    def release(self, session: FetchSession, tps: Iterable[TopicPartition]) -> None:
        holders = self.holders
        for tp in tps:
            held = holders.get(tp)
            if held is not None:
                held.pop(session, None)
                if not held:
                    del holders[tp]

    def get(self, session_id: int) -> FetchSession | None:
        return self.sessions.get(session_id)

    @property
    def size(self) -> int:
        return len(self.sessions)

    def new_session_id(self) -> int:
        while True:
            sid = self._rng.randint(1, _INT_MAX - 1)
            if sid not in self.sessions:
                return sid

    def maybe_create_session(self, now_ms: int, privileged: bool,
                             partitions: dict[SessionKey, CachedPartition],
                             replica_id: int = -1, uses_topic_ids: bool = False) -> int:
        """The new session's id, or INVALID_SESSION_ID when there is no slot for it."""
        if len(self.sessions) < self.max_entries or self.try_evict(
                privileged, (privileged, len(partitions), 0), now_ms):
            session = FetchSession(self.new_session_id(), privileged, partitions, now_ms,
                                   replica_id, uses_topic_ids)
            self.sessions[session.id] = session
            self.hold(session, session.keys_by_tp)
            self.touch(session, now_ms)
            return session.id
        return INVALID_SESSION_ID

    def try_evict(self, privileged: bool, key: tuple[bool, int, int], now_ms: int) -> bool:
        """Make room for a session with ``key``: evict a stale session, else the least valuable
        evictable one if it is worth less than the newcomer."""
        if not self.sessions:
            return False
        oldest = min(self.sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now_ms - oldest.last_used_ms > self.eviction_ms:
            self.remove(oldest.id)
            self.evictions += 1
            return True
        candidates = [s for s in self.sessions.values()
                      if (s.evictable_by_privileged if privileged else s.evictable_by_all)]
        if not candidates:
            return False
        least = min(candidates, key=FetchSession.evictable_key)
        if key < least.evictable_key():
            return False
        self.remove(least.id)
        self.evictions += 1
        return True

    def remove(self, session_id: int) -> FetchSession | None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self.num_partitions -= session.cached_size
            session.cached_size = -1
            self.release(session, session.keys_by_tp)
        return session

    def touch(self, session: FetchSession, now_ms: int) -> None:
        """Record a use: last-used time, size, and which newcomers may evict it."""
        session.last_used_ms = now_ms
        if session.cached_size != -1:
            self.num_partitions -= session.cached_size
        session.cached_size = session.size
        old = now_ms - session.creation_ms > self.eviction_ms
        session.evictable_by_privileged = not session.privileged or old
        session.evictable_by_all = old
        self.num_partitions += session.cached_size

# ---------------------------------------------------------------- contexts


class FetchContext:
    """One fetch request's view of its session: what to read, what to answer."""

    error: int = ErrorCode.NONE

    def partitions(self) -> dict[SessionKey, PartitionRequest]:
        """The partitions to read, in order."""
        raise NotImplementedError

    def topic_partition(self, key: SessionKey) -> TopicPartition | None:
        """The partition ``key`` names; None for a topic id the broker does not know."""
        raise NotImplementedError

    def update_and_generate_response(
        self, updates: Mapping[SessionKey, PartitionResponse], now_ms: int
    ) -> tuple[int, int, list[SessionKey]]:
        """(error, session id, the partitions to answer in order) after the read."""
        raise NotImplementedError


class SessionErrorContext(FetchContext):
    def __init__(self, error: int) -> None:
        self.error = error

    def partitions(self) -> dict[SessionKey, PartitionRequest]:
        return {}

    def topic_partition(self, key: SessionKey) -> TopicPartition | None:
        return None

    def update_and_generate_response(
        self, updates: Mapping[SessionKey, PartitionResponse], now_ms: int
    ) -> tuple[int, int, list[SessionKey]]:
        # The session's partitions are unknown: nothing but the error.
        return self.error, INVALID_SESSION_ID, []


class SessionlessFetchContext(FetchContext):
    def __init__(self, fetch_data: Mapping[SessionKey, PartitionRequest],
                 topic_names: Mapping[UUID, str] | None = None) -> None:
        self.fetch_data = fetch_data
        self.topic_names = topic_names or {}

    def partitions(self) -> dict[SessionKey, PartitionRequest]:
        return dict(self.fetch_data)

    def topic_partition(self, key: SessionKey) -> TopicPartition | None:
        return resolve(key, self.topic_names)

    def update_and_generate_response(
        self, updates: Mapping[SessionKey, PartitionResponse], now_ms: int
    ) -> tuple[int, int, list[SessionKey]]:
        return ErrorCode.NONE, INVALID_SESSION_ID, list(updates)


class FullFetchContext(SessionlessFetchContext):
    def __init__(self, cache: FetchSessionCache,
                 fetch_data: Mapping[SessionKey, PartitionRequest], is_from_follower: bool,
                 replica_id: int = -1, uses_topic_ids: bool = False,
                 topic_names: Mapping[UUID, str] | None = None) -> None:
        super().__init__(fetch_data, topic_names)
        self.cache = cache
        self.is_from_follower = is_from_follower
        self.replica_id = replica_id
        self.uses_topic_ids = uses_topic_ids

    def update_and_generate_response(
        self, updates: Mapping[SessionKey, PartitionResponse], now_ms: int
    ) -> tuple[int, int, list[SessionKey]]:
        # Every partition answered joins the session, an unknown topic id too (Kafka's).
        cached = {key: CachedPartition(self.fetch_data[key], resp, self.topic_partition(key))
                  for key, resp in updates.items()}
        session_id = self.cache.maybe_create_session(now_ms, self.is_from_follower, cached,
                                                     self.replica_id, self.uses_topic_ids)
        return ErrorCode.NONE, session_id, list(updates)


class IncrementalFetchContext(FetchContext):
    """Reads the listed and the dirty partitions of the session (``partitions``; a fetch held
    for ``min_bytes`` reads those turning dirty meanwhile with ``more_partitions``)."""

    def __init__(self, session: FetchSession, request_epoch: int) -> None:
        self.session = session
        self.request_epoch = request_epoch
        self.read: dict[SessionKey, PartitionRequest] = {}
        # Read partitions to read again next time even when nothing changed (set by the broker).
        self.unsettled: Collection[SessionKey] = ()

    def partitions(self) -> dict[SessionKey, PartitionRequest]:
        self.read = self.session.take_dirty()
        return dict(self.read)

    def topic_partition(self, key: SessionKey) -> TopicPartition | None:
        return self.session.topic_partition(key)

    def more_partitions(self) -> dict[SessionKey, PartitionRequest]:
        """The partitions that turned dirty since the last call (read them again)."""
        more = self.session.take_dirty()
        self.read.update(more)
        return more

    def abandon(self) -> None:
        """The fetch was not answered: what it read stays to be read."""
        self.session.dirty.update(dict.fromkeys(self.read))

    def update_and_generate_response(
        self, updates: Mapping[SessionKey, PartitionResponse], now_ms: int
    ) -> tuple[int, int, list[SessionKey]]:
        session = self.session
        if session.epoch != next_epoch(self.request_epoch):
            # Another request of this session went through meanwhile (a duplicate).
            self.abandon()
            return ErrorCode.INVALID_FETCH_SESSION_EPOCH, session.id, []
        out: list[SessionKey] = []
        cached_partitions = session.partitions
        any_records = False
        for key, resp in updates.items():
            cached = cached_partitions.get(key)
            if cached is None:  # forgotten while this request waited
                continue
            if resp.records_size:
                any_records = True
            if (not resp.records_size and resp.error == ErrorCode.NONE
                    and resp.preferred_read_replica < 0 and not resp.diverging
                    and cached.high_watermark == resp.high_watermark
                    and cached.local_log_start_offset == resp.log_start_offset):
                continue  # nothing new (most of an idle session): maybe_update_response_data's no
            if cached.maybe_update_response_data(resp, True):
                out.append(key)
                # Answered partitions go to the back of the read order (fairness, as Kafka).
                session._move_to_end(cached)
        # What was answered is read again (a fetcher that took it lists it anyway); with records
        # in the response everything read is, as max_bytes may have cut some partition short.
        again = updates if any_records else [*out, *self.unsettled]
        dirty = session.dirty
        for key in again:
            if key in cached_partitions:
                dirty[key] = None
        return ErrorCode.NONE, session.id, out


class FetchManager:
    def __init__(self, cache: FetchSessionCache) -> None:
        self.cache = cache

    def new_context(
        self,
        session_id: int,
        epoch: int,
        fetch_data: Mapping[SessionKey, PartitionRequest],
        to_forget: Iterable[SessionKey],
        is_follower: bool,
        now_ms: int,
        replica_id: int = -1,
        uses_topic_ids: bool = False,
        topic_names: Mapping[UUID, str] | None = None,
    ) -> FetchContext:
        """Kafka's ``FetchManager.newContext``. ``uses_topic_ids``: the request is Fetch v13+
        (its keys are TopicIdPartition); ``topic_names``: the ids the broker knows."""
        names = topic_names or {}
        if is_full(epoch):
            if session_id != INVALID_SESSION_ID:
                self.cache.remove(session_id)  # a full fetch closes the session it names
            if epoch == FINAL_EPOCH:
                return SessionlessFetchContext(fetch_data, names)
            return FullFetchContext(self.cache, fetch_data, is_follower, replica_id,
                                    uses_topic_ids, names)
        session = self.cache.get(session_id)
        if session is None:
            return SessionErrorContext(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != epoch:
            return SessionErrorContext(ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        if session.uses_topic_ids != uses_topic_ids:
            # A session by id fetched by name or the reverse (v12 and v13+ mixed).
            return SessionErrorContext(ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR)
        held, released = session.update(fetch_data, to_forget, names)
        if session.unresolved:
            held.extend(session.resolve_names(names))
        self.cache.hold(session, held)
        self.cache.release(session, released)
        if session.size == 0:
            self.cache.remove(session.id)
            return SessionlessFetchContext(fetch_data, names)
        session.previous_used_ms = session.last_used_ms
        self.cache.touch(session, now_ms)
        session.epoch = next_epoch(session.epoch)
        return IncrementalFetchContext(session, epoch)

    def mark_changed(self, tp: TopicPartition) -> None:
        """``tp`` changed (records, HW, log start, leadership): the sessions holding it read it
        at their next fetch, and a held fetch of theirs wakes."""
        held = self.cache.holders.get(tp)
        if held:
            for session in held:
                session.mark_dirty(tp)

    def follower_sessions(self) -> list[FetchSession]:
        return [s for s in self.cache.sessions.values() if s.replica_id >= 0]

