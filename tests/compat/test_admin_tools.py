"""Apache Kafka 3.9's own admin tools for issue 14's APIs, against Kafka and against tidelog:
kafka-topics --alter --partitions, kafka-delete-records, kafka-leader-election, kafka-log-dirs
and kafka-consumer-groups --delete succeed on tidelog and print what they print on Kafka
(log dir paths and sizes reduced to their shape)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from differential import Pair, Target, coordinator, create_ready, produce

from tidelog.testing.kafka_cluster import kafka_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPICS = "org.apache.kafka.tools.TopicCommand"
DELETE_RECORDS = "org.apache.kafka.tools.DeleteRecordsCommand"
LEADER_ELECTION = "org.apache.kafka.tools.LeaderElectionCommand"
LOG_DIRS = "org.apache.kafka.tools.LogDirsCommand"
CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


def tool(main_class: str, *args: str) -> tuple[int, str]:
    r = kafka_tool(main_class, *args)
    return r.returncode, r.stdout


def test_alter_partitions_delete_records_and_elect_leaders(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        bs = ("--bootstrap-server", t.bootstrap)
        create_ready(t, "tool-admin", 2, 3)
        produce(t, "tool-admin", [b"r%d" % i for i in range(6)], acks="all")
        seen: list[object] = [
            tool(TOPICS, *bs, "--alter", "--topic", "tool-admin", "--partitions", "4"),
            tool(TOPICS, *bs, "--alter", "--topic", "tool-admin", "--partitions", "3")[0],
        ]
        with tempfile.TemporaryDirectory() as d:
            offsets = Path(d) / "offsets.json"
            offsets.write_text(json.dumps({"version": 1, "partitions": [
                {"topic": "tool-admin", "partition": 0, "offset": 4}]}))
            seen.append(tool(DELETE_RECORDS, *bs, "--offset-json-file", str(offsets)))
        seen.append(tool(LEADER_ELECTION, *bs, "--election-type", "preferred", "--topic",
                         "tool-admin", "--partition", "0"))
        return seen

    got = pair.same(scenario)
    assert got[2] == (0, "Executing records delete operation\nRecords delete operation "
                         "completed:\npartition: tool-admin-0\tlow_watermark: 4\n")


def test_log_dirs_describe(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "tool-dirs", 1, 3)
        produce(t, "tool-dirs", [b"x" * 50] * 2, acks="all")
        code, out = tool(LOG_DIRS, "--bootstrap-server", t.bootstrap, "--describe",
                         "--topic-list", "tool-dirs")
        doc = json.loads(out.strip().splitlines()[-1])
        return code, sorted(
            (len(b["logDirs"]), [(p["partition"], p["offsetLag"], p["size"] > 0, p["isFuture"])
                                 for ld in b["logDirs"] for p in ld["partitions"]],
             [ld["error"] for ld in b["logDirs"]])
            for b in doc["brokers"])

    assert pair.same(scenario)[0] == 0


def test_consumer_groups_delete(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "tool-groups", 1, 3)
        coordinator(t, "g-tool")
        c = t.consumer(**{"group.id": "g-tool"})
        try:
            c.commit(offsets=[TopicPartition("tool-groups", 0, 0)], asynchronous=False)
        finally:
            c.close()
        bs = ("--bootstrap-server", t.bootstrap)
        return (tool(CONSUMER_GROUPS, *bs, "--delete", "--group", "g-tool"),
                tool(CONSUMER_GROUPS, *bs, "--delete", "--group", "g-tool"))

    pair.same(scenario)
