"""Apache Kafka 3.9's own command-line tools (kafka-topics, kafka-console-producer and
-consumer), run from the reference classpath against Kafka and against tidelog: each must
succeed on tidelog and show what it shows on Kafka (broker ids, assignments and topic ids, which
differ between any two clusters, are reduced to their shape)."""

from __future__ import annotations

import re

import pytest
from differential import Pair, Target

from tidelog.testing.kafka_cluster import kafka_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPICS = "org.apache.kafka.tools.TopicCommand"
CONSOLE_PRODUCER = "kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"


def tool(main_class: str, *args: str, input: str | None = None) -> tuple[int, str, str]:
    r = kafka_tool(main_class, *args, input=input)
    return r.returncode, r.stdout, r.stderr


def _describe_shape(out: str) -> list[object]:
    """kafka-topics --describe, each line as a dict of its fields; ids become their shape."""
    rows: list[object] = []
    for line in out.strip().splitlines():
        fields = dict(re.findall(r"(\w+): (\S*)", line))
        if "TopicId" in fields:
            fields["TopicId"] = "an id" if len(fields["TopicId"]) == 22 else fields["TopicId"]
        if "Replicas" in fields:
            replicas = fields["Replicas"].split(",")
            fields["Leader"] = "a replica" if fields["Leader"] in replicas else fields["Leader"]
            fields["Replicas"] = str(len(replicas))
            fields["Isr"] = str(len(fields["Isr"].split(",")))
        rows.append(fields)
    return rows


def test_kafka_topics_create_describe_list_and_delete(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        bs = ("--bootstrap-server", t.bootstrap)
        created = tool(TOPICS, *bs, "--create", "--topic", "tool-topic", "--partitions", "3",
                       "--replication-factor", "3", "--config", "retention.ms=3600000")
        again = tool(TOPICS, *bs, "--create", "--topic", "tool-topic", "--partitions", "1",
                     "--replication-factor", "1")
        code, described, err = tool(TOPICS, *bs, "--describe", "--topic", "tool-topic")
        assert code == 0, err
        code, listed, err = tool(TOPICS, *bs, "--list", "--exclude-internal")
        assert code == 0, err
        deleted = tool(TOPICS, *bs, "--delete", "--topic", "tool-topic")
        return (created[:2], again[0], "already exists" in again[1] + again[2],
                _describe_shape(described), "tool-topic" in listed.splitlines(),
                "__consumer_offsets" in listed, deleted[:2])

    got = pair.same(scenario)
    assert got[0] == (0, "Created topic tool-topic.\n")


def test_console_producer_then_console_consumer(pair: Pair) -> None:
    lines = [f"key-{i}\tvalue {i}" for i in range(20)]

    def scenario(t: Target) -> object:
        bs = ("--bootstrap-server", t.bootstrap)
        code, _, err = tool(TOPICS, *bs, "--create", "--topic", "console", "--partitions", "1",
                            "--replication-factor", "3")
        assert code == 0, err
        produced = tool(CONSOLE_PRODUCER, *bs, "--topic", "console",
                        "--producer-property", "acks=all", "--property", "parse.key=true",
                        input="\n".join(lines) + "\n")
        # Assigned, not subscribed: the group path is the OffsetCommit/OffsetFetch tests' job.
        consumed = tool(CONSOLE_CONSUMER, *bs, "--topic", "console", "--partition", "0",
                        "--offset", "earliest", "--max-messages", str(len(lines)), "--timeout-ms", "30000",
                        "--property", "print.key=true", "--property", "print.offset=true")
        return produced[0], consumed[0], consumed[1].splitlines()

    produced, consumed, out = pair.same(scenario)
    assert (produced, consumed) == (0, 0)
    assert out == [f"Offset:{i}\tkey-{i}\tvalue {i}" for i in range(20)]


GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


def _group_rows(out: str) -> list[list[str]]:
    """kafka-consumer-groups --describe's table, without the columns that name a consumer's
    id, host or client id (they differ between any two runs)."""
    rows = [line.split() for line in out.strip().splitlines() if line.strip()]
    header = rows[0] if rows else []
    keep = [i for i, h in enumerate(header) if h not in ("CONSUMER-ID", "HOST", "CLIENT-ID")]
    return [[r[i] for i in keep if i < len(r)] for r in rows]


def test_kafka_consumer_groups_list_and_describe(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        bs = ("--bootstrap-server", t.bootstrap)
        code, _, err = tool(TOPICS, *bs, "--create", "--topic", "grouped-tool", "--partitions",
                            "2", "--replication-factor", "3")
        assert code == 0, err
        # Keyed: the partitions are murmur2's, the same on both clusters, and both get records.
        tool(CONSOLE_PRODUCER, *bs, "--topic", "grouped-tool", "--property", "parse.key=true",
             input="k1\ta\nk2\tb\nk3\tc\nk4\td\n")
        consumed = tool(CONSOLE_CONSUMER, *bs, "--topic", "grouped-tool", "--group", "tool-g",
                        "--from-beginning", "--max-messages", "4", "--timeout-ms", "30000")
        listed = tool(GROUPS, *bs, "--list")
        code, described, err = tool(GROUPS, *bs, "--describe", "--group", "tool-g")
        assert code == 0, err
        missing = tool(GROUPS, *bs, "--describe", "--group", "no-such-group")
        return (consumed[0], sorted(consumed[1].split()), listed[0], "tool-g" in listed[1],
                _group_rows(described), missing[0], (missing[1] + missing[2]).strip()[-80:])

    got = pair.same(scenario)
    assert got[0] == 0 and got[1] == ["a", "b", "c", "d"]
