"""Two real brokers: a follower whose fetch session is held at its leader joins a partition that
leader just came to lead without waiting out the hold (replica.fetch.wait.max.ms, 30 s here),
so the first acks=all produce to a new topic is acknowledged well within its 10 s timeout."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from harness import ActingController, BrokerThread, produce, wait_until

from tidelog.protocol.records.builder import build_values

HOLD_MS = 30_000


@pytest.fixture
def pair(start_brokers: Callable[..., tuple[str, list[BrokerThread]]]
         ) -> tuple[str, list[BrokerThread]]:
    return start_brokers(2, **{
        "replica.fetch.wait.max.ms": HOLD_MS, "replica.socket.timeout.ms": HOLD_MS + 10_000,
        "replica.lag.time.max.ms": HOLD_MS + 10_000})


def test_the_first_acks_all_produce_to_a_new_topic_does_not_wait_out_the_followers_hold(
        pair: tuple[str, list[BrokerThread]]) -> None:
    zk, (b1, b2) = pair
    ctl = ActingController(zk, [b1, b2])
    try:
        ctl.create_topic("first", {0: [1, 2]})
        assert produce(b1.port, "first", 0, build_values([b"a"]), acks=-1) == (0, 0)
        apis = b1.server.apis

        def held() -> bool:
            return any(s.replica_id == 2 and s.waker is not None
                       for s in apis.fetch_manager.follower_sessions())

        wait_until(lambda: b1.call(held), what="broker 2's session fetch held at broker 1")
        # The leader gets its LeaderAndIsr first (the acting controller sends in broker order):
        # Kafka's follower would add the partition after its held fetch returned, 30 s later.
        ctl.create_topic("second", {0: [1, 2]})
        assert produce(b1.port, "second", 0, build_values([b"b"]), acks=-1,
                       timeout_ms=10_000) == (0, 0)
    finally:
        ctl.close()
