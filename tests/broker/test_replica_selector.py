"""KIP-392's replica selection at the leader (Kafka's RackAwareReplicaSelector and
ReplicaManager.findPreferredReadReplica) and ``replica.selector.class``."""

from __future__ import annotations

import random

import pytest

from tidelog.broker.config import ConfigError, KafkaConfig
from tidelog.broker.fetch_session import (
    INITIAL_EPOCH,
    FetchManager,
    FetchSessionCache,
    IncrementalFetchContext,
    PartitionResponse,
)
from tidelog.broker.replica_selector import (
    RACK_AWARE_REPLICA_SELECTOR,
    RackAwareReplicaSelector,
    ReplicaView,
    create_replica_selector,
    find_preferred_read_replica,
)
from tidelog.protocol.records.builder import build_values
from tidelog.replication import LeaderAndIsrPartitionState, Partition, TopicPartition
from tidelog.sim.disk import MemoryFileIO
from tidelog.storage.log import Log
from tidelog.storage.log_config import LogConfig

TP = TopicPartition("clicks", 0)
SELECTOR = RackAwareReplicaSelector()


def view(broker_id: int, rack: str | None, leo: int = 10, since_caught_up_ms: int = 0,
         has_endpoint: bool = True) -> ReplicaView:
    return ReplicaView(broker_id, rack, has_endpoint, leo, since_caught_up_ms)


# -- RackAwareReplicaSelector ------------------------------------------------------------------

def test_a_consumer_without_a_rack_reads_from_the_leader() -> None:
    leader = view(1, "a")
    assert SELECTOR.select("", [leader, view(2, "b")], leader) is leader


def test_the_leader_in_the_consumers_rack_is_kept_over_a_follower_there() -> None:
    leader = view(1, "a", leo=5)
    assert SELECTOR.select("a", [leader, view(2, "a", leo=9)], leader) is leader


def test_no_replica_in_the_consumers_rack_means_the_leader() -> None:
    leader = view(1, "a")
    assert SELECTOR.select("c", [leader, view(2, "b"), view(3, None)], leader) is leader


def test_the_most_caught_up_follower_of_the_rack_is_chosen() -> None:
    leader = view(1, "a")
    # Highest LEO first, then the shortest time since caught up, then the highest id.
    assert SELECTOR.select("b", [leader, view(2, "b", leo=9), view(3, "b", leo=10)],
                           leader).broker_id == 3
    assert SELECTOR.select("b", [leader, view(2, "b", since_caught_up_ms=5),
                                 view(3, "b", since_caught_up_ms=50)], leader).broker_id == 2
    assert SELECTOR.select("b", [leader, view(3, "b"), view(2, "b")], leader).broker_id == 3


# -- findPreferredReadReplica ------------------------------------------------------------------

def leader_with_followers(isr: tuple[int, ...] = (1, 2, 3), records: int = 10) -> Partition:
    """Broker 1 leads TP over (1, 2, 3) with ``records`` records; both followers fetched up to
    the end at t=100."""
    p = Partition(TP, 1, Log("/b1/clicks-0", LogConfig(), MemoryFileIO()))
    p.make_leader(LeaderAndIsrPartitionState(TP.topic, TP.partition, 1, 1, 0, isr, 0, (1, 2, 3)),
                  0)
    if records:
        p.append_records_to_leader(bytes(build_values([b"v"] * records)), 1, 0)
    for follower in (2, 3):
        p.update_follower_fetch_state(follower, p.log_end_offset, 0, 100, p.log_end_offset)
    return p


RACKS: dict[int, str | None] = {1: "a", 2: "b", 3: "c"}


def test_the_leader_names_the_follower_in_the_consumers_rack() -> None:
    p = leader_with_followers()
    assert find_preferred_read_replica(SELECTOR, p, "b", 4, 200, RACKS) == 2
    assert find_preferred_read_replica(SELECTOR, p, "c", 10, 200, RACKS) == 3


def test_no_preferred_replica_when_the_leader_is_the_choice() -> None:
    p = leader_with_followers()
    assert find_preferred_read_replica(SELECTOR, p, "a", 4, 200, RACKS) is None
    assert find_preferred_read_replica(SELECTOR, p, "", 4, 200, RACKS) is None
    assert find_preferred_read_replica(SELECTOR, p, "elsewhere", 4, 200, RACKS) is None


def test_a_follower_out_of_the_isr_is_never_named() -> None:
    p = leader_with_followers(isr=(1, 3))
    assert find_preferred_read_replica(SELECTOR, p, "b", 4, 200, RACKS) is None


def test_a_follower_without_the_fetch_offset_is_never_named() -> None:
    p = leader_with_followers()
    # Follower 2 has fetched only up to 6: offset 8 is not in its log yet.
    p.update_follower_fetch_state(2, 6, 0, 150, p.log_end_offset)
    assert find_preferred_read_replica(SELECTOR, p, "b", 8, 200, RACKS) is None
    assert find_preferred_read_replica(SELECTOR, p, "b", 6, 200, RACKS) == 2
    # Its log starts at 3: offset 2 is gone from it.
    p.update_follower_fetch_state(2, 10, 3, 160, p.log_end_offset)
    assert find_preferred_read_replica(SELECTOR, p, "b", 2, 200, RACKS) is None


def test_a_follower_with_no_endpoint_for_the_consumer_is_never_named() -> None:
    # Not alive, or no endpoint on the consumer's listener: Kafka's Node.noNode(), no rack.
    p = leader_with_followers()
    assert find_preferred_read_replica(SELECTOR, p, "b", 4, 200, {1: "a", 3: "c"}) is None


def test_a_follower_names_no_replica() -> None:
    p = Partition(TP, 2, Log("/b2/clicks-0", LogConfig(), MemoryFileIO()))
    p.make_follower(LeaderAndIsrPartitionState(TP.topic, TP.partition, 1, 1, 0, (1, 2, 3), 0,
                                               (1, 2, 3)), 0)
    assert find_preferred_read_replica(SELECTOR, p, "b", 0, 200, RACKS) is None


# -- replica.selector.class --------------------------------------------------------------------

def test_replica_selector_class_is_unset_by_default() -> None:
    assert KafkaConfig({"zookeeper.connect": "127.0.0.1:2181"}).get("replica.selector.class") \
        is None
    assert create_replica_selector(None) is None


def test_the_rack_aware_selector_is_accepted() -> None:
    config = KafkaConfig({"zookeeper.connect": "127.0.0.1:2181",
                          "replica.selector.class": RACK_AWARE_REPLICA_SELECTOR})
    assert isinstance(create_replica_selector(config.get("replica.selector.class")),
                      RackAwareReplicaSelector)


@pytest.mark.parametrize("name", ["com.example.NearestSelector",
                                  "org.apache.kafka.common.replica.LeaderSelector", ""])
def test_any_other_class_is_refused_as_kafka_fails_to_load_it(name: str) -> None:
    with pytest.raises(ConfigError, match=f"replica.selector.class: "
                                          f"java.lang.ClassNotFoundException: {name}"):
        KafkaConfig({"zookeeper.connect": "127.0.0.1:2181", "replica.selector.class": name})


# -- fetch sessions ----------------------------------------------------------------------------

def test_an_incremental_session_always_answers_a_preferred_read_replica() -> None:
    # Kafka's CachedPartition.maybeUpdateResponseData: isPreferredReplica means must respond,
    # even with the HW and log start unchanged and no records.
    fm = FetchManager(FetchSessionCache(10, 120_000, random.Random(7)))
    ctx = fm.new_context(0, INITIAL_EPOCH, {TP: (4, 0, 0, 1000, -1)}, [], False, 0)
    _, sid, answered = ctx.update_and_generate_response({TP: PartitionResponse(0, 10, 0, 0)}, 0)
    assert answered == [TP]
    ctx = fm.new_context(sid, 1, {TP: (4, 0, 0, 1000, -1)}, [], False, 10)
    assert isinstance(ctx, IncrementalFetchContext)
    assert ctx.update_and_generate_response({TP: PartitionResponse(0, 10, 0, 0)}, 10) == (
        0, sid, [])
    ctx = fm.new_context(sid, 2, {TP: (4, 0, 0, 1000, -1)}, [], False, 20)
    assert ctx.update_and_generate_response({TP: PartitionResponse(0, 10, 0, 0, 2)}, 20) == (
        0, sid, [TP])
