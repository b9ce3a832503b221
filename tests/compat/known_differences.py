"""Where tidelog knowingly answers differently from Apache Kafka 3.9, and why: the one list that
docs/compatibility.md's table of differences is generated from (tools/compat_matrix.py). Each
entry names the test that asserts the difference still holds; a fix makes that test fail, and the
entry then goes (the tool refuses an entry whose test does not exist)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Difference:
    what: str
    kafka: str
    tidelog: str
    why: str
    test: str  # the node id (tests/compat/<file>::<test>) of the test asserting it


# The topic keys of Kafka 3.9 that tidelog's LogConfig lacks: DescribeConfigs and CreateTopics
# v5+ list them on Kafka only. test_topics.py and test_python_clients.py assert exactly these.
ABSENT_TOPIC_KEYS = {
    # KIP-405 tiered storage
    "local.retention.bytes": "no tiered storage",
    "local.retention.ms": "no tiered storage",
    "remote.storage.enable": "no tiered storage",
    "remote.log.copy.disable": "no tiered storage",
    "remote.log.delete.on.disable": "no tiered storage",
    # deprecated since 3.0, ignored by Kafka 3.x brokers
    "message.format.version": "only record batch v2 is written",
}

DIFFERENCES: dict[str, Difference] = {
    "absent topic keys": Difference(
        what="DescribeConfigs of a topic (and CreateTopics v5+'s configs): "
             + ", ".join(f"`{k}`" for k in ABSENT_TOPIC_KEYS),
        kafka="listed with their defaults",
        tidelog="absent; setting one is refused as an unknown key",
        why="there is no tiered storage (KIP-405), and only record batch v2 is written "
            "(message.format.version)",
        test="tests/compat/test_topics.py::test_a_topics_config_description_matches",
    ),
    "describe configs documentation": Difference(
        what="DescribeConfigs v3+ of a topic, documentation not asked for",
        kafka="no documentation (null) for every key",
        tidelog="a note on each key it accepts only at its default (`preallocate`: \"tidelog "
                "accepts only the default: ...\"), null for the others",
        why="tidelog tells why such a value is refused; Kafka, asked for documentation, would "
            "send its own text for every key, which tidelog does not carry",
        test="tests/compat/test_python_clients.py::test_kafka_python",
    ),
    "lz4 level": Difference(
        what="`compression.lz4.level` other than 9 (CreateTopics, AlterConfigs)",
        kafka="accepted (1-17): LZ4's high-compression mode at that level",
        tidelog="INVALID_CONFIG: only 9, LZ4's fast compressor (Kafka's default)",
        why="cramjam's LZ4 block API has no high-compression mode, and a config tidelog "
            "accepts is one it enforces",
        test="tests/compat/test_topics.py::test_a_non_default_lz4_level_is_refused_by_tidelog_only",
    ),
    "fetch v0-3": Difference(
        what="a client's Fetch v0-3",
        kafka="served: down-converted to the old record format "
              "(`message.downconversion.enable=true`, the default) or UNSUPPORTED_VERSION per "
              "partition (false)",
        tidelog="not advertised (Fetch v4+)",
        why="tidelog never down-converts; the config takes both values, since for Fetch v4+ "
            "Kafka does not consult it",
        test="tests/compat/test_api_versions_against_kafka.py::test_fetch_v0_to_v3_are_not_served",
    ),
    "listener keys per broker": Difference(
        what="a per-broker change of the listener keys",
        kafka="applied live",
        tidelog="INVALID_REQUEST (read-only until a restart)",
        why="tidelog's broker does not rebind its listeners live",
        test="tests/compat/test_dynamic_broker_keys_against_kafka.py::"
             "test_the_listener_keys_per_broker_differ_as_documented",
    ),
    "held fetch fenced by the same leader's new epoch": Difference(
        what="a Fetch held for min_bytes naming the leader epoch that a LeaderAndIsr keeping "
             "the same leader moves past (e.g. a reassignment that only reorders the replicas)",
        kafka="FENCED_LEADER_EPOCH at the fetch's max_wait_ms (ZooKeeper mode: makeLeader "
              "re-checks held fetches only when the HW moves)",
        tidelog="FENCED_LEADER_EPOCH at once",
        why="the same answer, sooner: tidelog re-checks held fetches at every role change, "
            "and a consumer with a stale epoch refreshes its metadata without waiting",
        test="tests/compat/test_held_fetches_against_kafka.py::"
             "test_held_fetches_fenced_by_a_new_epoch_of_the_same_leader",
    ),
    "new leader's hw not caught up": Difference(
        what="a consumer's Fetch at a new leader whose HW is still below its epoch's start "
             "offset (a follower of the ISR has not fetched from it yet)",
        kafka="NONE, read up to that lower HW; for a consumer in another replica's rack "
              "(KIP-392) that replica is named as preferred_read_replica, with the lower HW",
        tidelog="OFFSET_NOT_AVAILABLE (retriable) until the HW reaches the epoch's start, as "
                "both answer ListOffsets LATEST (KIP-207)",
        why="a consumer never sees the HW go back from one the old leader showed "
            "(DESIGN's MonotonicHighWatermark; the core's `consumer_hw_guard=False` answers "
            "as Kafka)",
        test="tests/compat/test_preferred_read_replica_against_kafka.py::"
             "test_a_new_leader_whose_hw_has_not_caught_up",
    ),
    "stale broker epoch in the isr": Difference(
        what="a replica's Fetch v15+ whose ReplicaState names a broker epoch older than its "
             "broker's current registration (the process before a restart), caught up",
        kafka="ZooKeeper mode: the replica joins the ISR (the leader checks only that its "
              "broker is alive); KRaft mode refuses it (KIP-903)",
        tidelog="the replica stays out of the ISR (KRaft's rule: the leader and the ISR writer "
                "check the epoch against /brokers/ids)",
        why="a restarted broker may have lost its log (KIP-903's unclean-shutdown case); the "
            "same rule runs in the simulator (docs/architecture.md)",
        test="tests/compat/test_isr_broker_epochs_against_kafka.py::"
             "test_a_fetch_from_a_follower_s_previous_registration_and_the_isr",
    ),
}
