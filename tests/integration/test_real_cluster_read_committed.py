"""READ_COMMITTED across partition-leader failures on real processes (issue 17 item 3): a
confluent-kafka transactional producer writes transaction after transaction to two partitions
while the leader of one of them is killed with -9 (and later restarted, then the other leader
stopped); a read_committed consumer reads all along, another one everything at the end. The
simulator's exactly-once checks
(sim/txn_invariants.py) hold over what it read: no record of an aborted transaction, every
committed record exactly once, nothing of an undecided transaction half visible."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from real_cluster_harness import (
    RealCluster,
    read_committed_to_the_end,
    running_cluster,
    wait_for,
)

from tidelog.protocol.records.decoder import DecodedRecord
from tidelog.replication.types import TopicPartition
from tidelog.sim.txn_invariants import TxnLedger, txn_value

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

TXN_ID = "rc-writer"
TOPIC = "rc-out"
TRANSACTIONS = 30
PER_PARTITION = 3
TPS = [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]


@pytest.fixture(scope="module")
def rc_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    d: Path = tmp_path_factory.mktemp("read-committed")
    with running_cluster(d) as c:
        yield c


def run_transaction(p: confluent_kafka.Producer, ledger: TxnLedger, n: int) -> None:
    """One transaction of PER_PARTITION records per partition; its outcome into the ledger.
    A retriable error retries the commit, an abortable one aborts (librdkafka's loop)."""
    txn = (TXN_ID, n)
    p.begin_transaction()
    for tp in TPS:
        ledger.wrote(txn, tp, PER_PARTITION)
        for i in range(PER_PARTITION):
            p.produce(TOPIC, value=txn_value(TXN_ID, n, i, PER_PARTITION), partition=tp.partition)
    if n % 5 == 4:  # every fifth is aborted on purpose: read_committed must not show it
        p.abort_transaction(60)
        ledger.outcome(txn, False)
        return
    deadline = time.monotonic() + 120
    while True:
        try:
            p.commit_transaction(30)
            ledger.outcome(txn, True)
            return
        except confluent_kafka.KafkaException as e:
            err = e.args[0]
            if err.retriable() and time.monotonic() < deadline:
                continue
            if err.txn_requires_abort():
                p.abort_transaction(60)
                ledger.outcome(txn, False)
                return
            raise


def reader_config(group: str) -> dict[str, object]:
    return {"group.id": group, "isolation.level": "read_committed",
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "enable.partition.eof": True}


def consume(ledger: TxnLedger, msg: confluent_kafka.Message) -> None:
    ledger.consumed(TopicPartition(TOPIC, msg.partition()),
                    [DecodedRecord(msg.offset(), 0, msg.key(), msg.value(), ())])


def test_read_committed_through_leader_failures(rc_cluster: RealCluster) -> None:
    c = rc_cluster
    c.create_topic(TOPIC, partitions=2)
    ledger = TxnLedger()
    stop = threading.Event()
    consumer = confluent_kafka.Consumer({"bootstrap.servers": c.bootstrap,
                                         **reader_config("rc-reader")})
    consumer.assign([confluent_kafka.TopicPartition(TOPIC, tp.partition, 0) for tp in TPS])

    def read() -> None:  # all along the faults
        while not stop.is_set():
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                consume(ledger, msg)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    p = confluent_kafka.Producer({"bootstrap.servers": c.bootstrap, "transactional.id": TXN_ID,
                                  "transaction.timeout.ms": 60000, "message.timeout.ms": 60000})
    p.init_transactions(60)
    killed = stopped = -1
    try:
        for n in range(TRANSACTIONS):
            if n == TRANSACTIONS // 3:
                killed = c.state(TOPIC, 0).leader  # type: ignore[union-attr]
                c.kill(killed)
            if n == TRANSACTIONS // 2:
                c.start(killed)
            if n == 2 * TRANSACTIONS // 3:
                wait_for(lambda: all(len(c.state(TOPIC, tp.partition).isr) == 3  # type: ignore
                                     for tp in TPS), what="the restarted broker back in sync")
                stopped = c.state(TOPIC, 1).leader  # type: ignore[union-attr]
                c.stop(stopped)
            run_transaction(p, ledger, n)
        p.flush(30)
        c.start(stopped)
    finally:
        stop.set()
        reader.join(10)
        consumer.close()
    for msg in read_committed_to_the_end(c.bootstrap, TOPIC, [tp.partition for tp in TPS],
                                         "rc-final"):
        consume(ledger, msg)
    assert ledger.violations == [] and ledger.final_checks(TPS) == []
    assert len(ledger.committed) >= TRANSACTIONS * 4 // 5 - 3, (ledger.committed, ledger.aborted)
    assert killed >= 0 and stopped >= 0
