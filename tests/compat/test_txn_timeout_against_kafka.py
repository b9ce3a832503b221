"""A transaction left open past its transaction.timeout.ms, on Kafka 3.9 and on tidelog: the
coordinator aborts it on its own (every
transaction.abort.timed.out.transaction.cleanup.interval.ms, 10 s by default) under a bumped
epoch, so a read_committed consumer's end moves past it without its records, DescribeTransactions
shows CompleteAbort at the next epoch, and the producer's late commit fails the same way."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import KafkaException
from differential import Pair, Target, coordinator, create_ready, raw
from test_transactions_against_kafka import read

from tidelog.protocol.messages import describe_transactions as m_dtx

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "txn-timeout-out"  # its own: the compat clusters live for the whole session


def scenario(t: Target) -> object:
    create_ready(t, TOPIC, 1, 3)
    tid = f"txn-timeout-{uuid.uuid4().hex[:6]}"
    p = t.producer(**{"transactional.id": tid, "enable.idempotence": True,
                      "transaction.timeout.ms": 1000, "message.timeout.ms": 1000})
    p.init_transactions(60)
    p.begin_transaction()
    p.produce(TOPIC, value=b"timed-out", partition=0)
    assert p.flush(30) == 0
    deadline = time.monotonic() + 60
    while True:  # the coordinator's abort writes the marker: the LSO reaches the HW
        committed, uncommitted = read(t, "read_committed", TOPIC), read(t, "read_uncommitted", TOPIC)
        if committed[0] == uncommitted[0] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    state = raw(coordinator(t, tid, key_type=1),
                m_dtx.DescribeTransactionsRequest(transactional_ids=[tid]), 0).transaction_states[0]
    try:
        p.commit_transaction(30)
        late = "committed"
    except KafkaException as e:
        err = e.args[0]
        late = f"{err.name()} fatal={err.fatal()} abortable={err.txn_requires_abort()}"
    return (committed[0] == uncommitted[0], b"timed-out" in [v for _, v in committed[1]],
            b"timed-out" in [v for _, v in uncommitted[1]],
            (state.error_code, state.transaction_state, state.producer_epoch), late)


def test_an_open_transaction_past_its_timeout_is_aborted(pair: Pair) -> None:
    got = pair.same(scenario)
    assert got[:4] == (True, False, True, (0, "CompleteAbort", 1)), got
