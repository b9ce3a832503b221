"""Spark reading a topic a transactional producer wrote (issue 17 item 4), through both
connectors: with kafka.isolation.level=read_committed Spark's own Kafka connector and the
tidelog connector read the committed transactions only (the tidelog one to the LSO, dropping
the aborted transactions the broker lists and the markers), with read_uncommitted every
record."""

from __future__ import annotations

import confluent_kafka
import pytest

from tidelog.spark.options import TidelogOptionError, parse_sink_options, parse_source_options

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("connector", ["kafka", "tidelog"])
def test_read_committed_reads_committed_transactions_only(spark, broker, kafka_format: str,
                                                          connector: str) -> None:
    topic = broker.new_topic(partitions=2)
    p = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                  "transactional.id": f"spark-{topic}"})
    p.init_transactions(60)
    for tag, commit in (("c1", True), ("a", False), ("c2", True)):
        p.begin_transaction()
        for i in range(6):
            p.produce(topic, value=f"{tag}-{i}".encode(), partition=i % 2)
        if commit:
            p.commit_transaction(60)
        else:
            p.flush(30)
            p.abort_transaction(60)

    def values(isolation: str) -> list[str]:
        rows = (spark.read.format(kafka_format if connector == "kafka" else "tidelog")
                .option("kafka.bootstrap.servers", broker.bootstrap)
                .option("kafka.isolation.level", isolation)
                .option("subscribe", topic).load().collect())
        return sorted(r.value.decode() for r in rows)

    committed = sorted(f"{t}-{i}" for t in ("c1", "c2") for i in range(6))
    assert values("read_committed") == committed
    assert values("read_uncommitted") == sorted(committed + [f"a-{i}" for i in range(6)])


def test_the_isolation_level_is_checked_and_the_sink_refuses_it() -> None:
    options = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}
    assert not parse_source_options(options, streaming=False).read_committed
    assert parse_source_options({**options, "kafka.isolation.level": "READ_COMMITTED"},
                                streaming=True).read_committed
    with pytest.raises(TidelogOptionError, match="kafka.isolation.level"):
        parse_source_options({**options, "kafka.isolation.level": "committed"},
                             streaming=False)
    with pytest.raises(TidelogOptionError, match="kafka.isolation.level"):
        parse_sink_options({"kafka.bootstrap.servers": "127.0.0.1:9092",
                            "kafka.isolation.level": "read_committed"})
