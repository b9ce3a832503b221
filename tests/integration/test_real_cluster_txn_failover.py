"""The transaction coordinator fails over on real processes (issue 17 item 1): a
confluent-kafka transactional producer commits transaction after transaction while the broker
coordinating its transactional.id is killed with -9 in the middle of them; the new coordinator
(the new leader of its `__transaction_state` partition) loads the partition and carries on, and a
read_committed consumer reads every record of every transaction the producer saw committed,
exactly once, and nothing of the ones it aborted."""

from __future__ import annotations

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

from tidelog.coordinator.offsets import partition_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

TXN_ID = "failover-tx"
TOPIC = "eos"
TRANSACTIONS = 30
PER_TXN = 4


@pytest.fixture(scope="module")
def txn_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    d: Path = tmp_path_factory.mktemp("txn-failover")
    with running_cluster(d) as c:
        yield c


def coordinator_of(c: RealCluster) -> int:
    state = c.state("__transaction_state", partition_for(TXN_ID, 50))
    assert state is not None
    return state.leader


def run_transaction(p: confluent_kafka.Producer, n: int) -> bool:
    """One transaction; True when committed. A retriable error retries the commit, an abortable
    one aborts (librdkafka's documented loop)."""
    p.begin_transaction()
    for i in range(PER_TXN):
        p.produce(TOPIC, value=f"t{n}-r{i}".encode(), partition=i % 2)
    deadline = time.monotonic() + 120
    while True:
        try:
            p.commit_transaction(30)
            return True
        except confluent_kafka.KafkaException as e:
            err = e.args[0]
            if err.retriable() and time.monotonic() < deadline:
                continue
            if err.txn_requires_abort():
                p.abort_transaction(60)
                return False
            raise


def test_commits_survive_the_coordinator_killed(txn_cluster: RealCluster) -> None:
    c = txn_cluster
    c.create_topic(TOPIC, partitions=2)
    p = confluent_kafka.Producer({"bootstrap.servers": c.bootstrap, "transactional.id": TXN_ID,
                                  "transaction.timeout.ms": 60000, "message.timeout.ms": 60000})
    p.init_transactions(60)
    killed = coordinator_of(c)
    committed: list[int] = []
    aborted: list[int] = []
    for n in range(TRANSACTIONS):
        if n == TRANSACTIONS // 3:
            c.kill(killed)
        (committed if run_transaction(p, n) else aborted).append(n)
    new_coordinator = wait_for(lambda: (b := coordinator_of(c)) != killed and b >= 0 and b,
                               what="a new transaction coordinator")
    c.start(killed)
    p.flush(30)

    expected = sorted(f"t{n}-r{i}" for n in committed for i in range(PER_TXN))
    got = [m.value().decode() for m in read_committed_to_the_end(
        c.bootstrap, TOPIC, [0, 1], "failover-reader")]
    assert len(committed) >= TRANSACTIONS - 3, (committed, aborted)
    assert sorted(got) == expected
    assert new_coordinator != killed
