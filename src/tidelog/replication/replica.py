"""Replica: the leader's view of one follower (seed 000's ``Replica``, a "remote replica").

The leader learns a follower's LEO from the fetch offset of each of its fetches (a follower asks
for the offset it is missing next, which is its LEO). ``last_caught_up_time_ms`` is the last
time the follower was known to have everything the leader had; the ISR lag policies judge a
follower by it.

Caught-up rule (seed 000's ``updateLogReadResult``; written the way later Kafka does it so that it
uses only the follower's own confirmation): a fetch at ``fetch_offset >= leader LEO`` means the
follower is caught up now; otherwise, if ``fetch_offset >=`` the leader's LEO at the previous
fetch, the previous fetch read up to the leader's LEO as of that fetch, so the follower was caught
up at the previous fetch's time.
"""

from __future__ import annotations

from dataclasses import dataclass

UNKNOWN_OFFSET = -1


@dataclass(slots=True)
class Replica:
    broker_id: int
    log_end_offset: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    last_caught_up_time_ms: int = 0
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET
    last_fetch_time_ms: int = 0
    # the broker epoch (ZooKeeper registration) the last fetch came with; None: not sent (KIP-903)
    broker_epoch: int | None = None

    def update_fetch_state(
        self,
        fetch_offset: int,
        log_start_offset: int,
        fetch_time_ms: int,
        leader_end_offset: int,
        broker_epoch: int | None = None,
    ) -> None:
        if fetch_offset >= leader_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, fetch_time_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        self.log_end_offset = fetch_offset
        self.log_start_offset = log_start_offset
        self.last_fetch_leader_log_end_offset = leader_end_offset
        self.last_fetch_time_ms = fetch_time_ms
        self.broker_epoch = broker_epoch

    def replay_fetch(self, fetch_time_ms: int) -> None:
        """A fetch at ``fetch_time_ms`` with the fetch offset, log start and leader LEO of the
        last recorded one (an unchanged partition of a fetch session): `update_fetch_state`
        with those values."""
        if fetch_time_ms <= self.last_fetch_time_ms:
            return
        if self.log_end_offset >= self.last_fetch_leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, fetch_time_ms)
        self.last_fetch_time_ms = fetch_time_ms

    def reset_replica_state(
        self,
        now_ms: int,
        leader_end_offset: int,
        is_new_leader: bool,
        is_follower_in_sync: bool,
    ) -> None:
        """On make_leader. A new leader knows nothing of the followers' logs: LEO unknown (so the
        HW cannot advance past them) and, for ISR members, the lag clock starts now so that they
        get a full ``replica.lag.time.max.ms`` to fetch before being shrunk."""
        if is_new_leader:
            self.last_caught_up_time_ms = now_ms if is_follower_in_sync else 0
            self.log_end_offset = UNKNOWN_OFFSET
            self.log_start_offset = UNKNOWN_OFFSET
            self.broker_epoch = None
        self.last_fetch_leader_log_end_offset = leader_end_offset
        self.last_fetch_time_ms = now_ms
