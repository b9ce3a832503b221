"""ISR lag policies: when is a follower in the ISR out of sync (seed 000, seed 003)?

- ``TimeLagPolicy`` (Kafka >= 0.9, ``replica.lag.time.max.ms``, default 10 s): out of sync when
  it has not been caught up for longer than the limit. One rule catches both stuck followers (no
  fetches: ``last_caught_up_time_ms`` stops moving) and slow ones (fetching, but never reaching
  the leader's LEO). A burst of produce traffic does not trip it: a healthy follower is caught up
  again at its next fetch.
- ``MessageLagPolicy`` (before 0.9): the time rule for stuck followers plus
  ``replica.lag.max.messages``: out of sync as soon as the follower's LEO is more than N messages
  behind the leader's. A burst larger than N throws every follower out of the ISR until its next
  fetch puts it back: the flapping seed 003 describes.
"""

from __future__ import annotations

from typing import Protocol

from tidelog.replication.config import ReplicationConfig
from tidelog.replication.replica import Replica


class IsrLagPolicy(Protocol):
    def is_out_of_sync(self, replica: Replica, leader_end_offset: int, now_ms: int) -> bool: ...


class TimeLagPolicy:
    def __init__(self, replica_lag_time_max_ms: int = 10_000) -> None:
        self.replica_lag_time_max_ms = replica_lag_time_max_ms

    def is_out_of_sync(self, replica: Replica, leader_end_offset: int, now_ms: int) -> bool:
        return now_ms - replica.last_caught_up_time_ms > self.replica_lag_time_max_ms

    def __repr__(self) -> str:
        return f"TimeLagPolicy(replica.lag.time.max.ms={self.replica_lag_time_max_ms})"


class MessageLagPolicy:
    def __init__(self, replica_lag_max_messages: int = 4000, replica_lag_time_max_ms: int = 10_000) -> None:
        self.replica_lag_max_messages = replica_lag_max_messages
        self.replica_lag_time_max_ms = replica_lag_time_max_ms

    def is_out_of_sync(self, replica: Replica, leader_end_offset: int, now_ms: int) -> bool:
        # 0.8's "stuck" rule: no fetch within the time limit.
        if now_ms - replica.last_fetch_time_ms > self.replica_lag_time_max_ms:
            return True
        # 0.8's "slow" rule; an unknown LEO (new leader, no fetch yet) is judged by time only.
        return (
            replica.log_end_offset >= 0
            and leader_end_offset - replica.log_end_offset > self.replica_lag_max_messages
        )

    def __repr__(self) -> str:
        return (
            f"MessageLagPolicy(replica.lag.max.messages={self.replica_lag_max_messages}, "
            f"replica.lag.time.max.ms={self.replica_lag_time_max_ms})"
        )


def policy_for(config: ReplicationConfig) -> IsrLagPolicy:
    if config.replica_lag_max_messages is not None:
        return MessageLagPolicy(config.replica_lag_max_messages, config.replica_lag_time_max_ms)
    return TimeLagPolicy(config.replica_lag_time_max_ms)
