"""min.insync.replicas above the replication factor counts as the replication factor (Kafka's
Partition.effectiveMinIsr; tests/compat shows Kafka 3.9 taking such writes)."""

from __future__ import annotations

import pytest
from replication_helpers import fetch, leader_partition, records

from tidelog.replication import Errors, ReplicationError


def test_one_replica_with_min_insync_two_takes_and_commits_acks_all() -> None:
    p = leader_partition(isr=(1,), replicas=(1,), min_insync_replicas=2)
    assert p.min_insync_replicas == 1
    p.append_records_to_leader(records(2), acks=-1, now_ms=0)
    assert p.high_watermark == 2
    assert p.check_enough_replicas_reach_offset(2) == (True, Errors.NONE)


def test_two_replicas_with_min_insync_three_need_both() -> None:
    p = leader_partition(isr=(1, 2), replicas=(1, 2), min_insync_replicas=3)
    assert p.min_insync_replicas == 2
    p.append_records_to_leader(records(1), acks=-1, now_ms=0)
    fetch(p, 2, 1, now_ms=1)
    assert p.high_watermark == 1
    shrunk = leader_partition(isr=(1,), replicas=(1, 2), min_insync_replicas=3)
    with pytest.raises(ReplicationError) as e:
        shrunk.append_records_to_leader(records(1), acks=-1, now_ms=0)
    assert e.value.error == Errors.NOT_ENOUGH_REPLICAS
