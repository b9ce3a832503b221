"""Kafka's own Java clients (kafka-clients 3.9.1) in a consume-transform-produce loop with
exactly-once (interop/src/main/java/tidelog/interop/Harness.java `transactions`): transactions
committed with the input offsets (sendOffsetsToTransaction with the group metadata, KIP-447),
one aborted, a zombie fenced by a newer instance, Admin's describeTransactions and
listTransactions, read_committed and read_uncommitted reads; the same on Kafka and tidelog."""

from __future__ import annotations

import pytest
from differential import Pair
from test_java_clients import harness

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_java_exactly_once_loop(pair: Pair) -> None:
    got = pair.same(lambda t: harness("transactions", t))
    assert "transformed: 6" in got and "zombie: ProducerFencedException" in got
    assert "group offsets: {java-tx-in-0=3, java-tx-in-1=3}" in got
    # The aborted record is read only without isolation.
    committed = next(line for line in got if line.startswith("read_committed: "))
    uncommitted = next(line for line in got if line.startswith("read_uncommitted: "))
    assert "ABORTED" not in committed and "ABORTED" in uncommitted and "ZOMBIE" not in uncommitted
