"""Truncation on fetch between real brokers (KIP-595, Kafka's replica fetcher since IBP 2.7): a
follower whose log has a tail the new leader never had (an unclean election) sends its last
fetched epoch, gets the leader's diverging epoch and truncates there — no OffsetsForLeaderEpoch
request reaches the leader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness import ActingController, BrokerThread, broker_props, produce, wait_until
from zk_chroot import new_chroot

from tidelog.cluster.zookeeper import ZooKeeperServer
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.records.builder import build_values


def count_requests(b: BrokerThread, keys: tuple[ApiKey, ...]) -> dict[ApiKey, list[Any]]:
    """Every request of these kinds broker b handles from now on (in its loop's order)."""
    seen: dict[ApiKey, list[Any]] = {k: [] for k in keys}

    def install() -> None:
        apis = b.server.apis
        for key in keys:
            handle = apis.handlers[key]

            async def recording(ctx: Any, request: Any, key: ApiKey = key,
                                handle: Any = handle) -> Any:
                seen[key].append(request)
                return await handle(ctx, request)

            apis.register_handler(key, recording)

    b.call(install)
    return seen


def batches(b: BrokerThread, topic: str) -> list[tuple[int, int, int]]:
    return b.call(lambda: [(x.base_offset, x.last_offset, x.partition_leader_epoch)
                           for x in b.server.log_manager.get_log(topic, 0).batches()])


@pytest.mark.integration
def test_after_an_unclean_election_the_old_leader_truncates_on_the_fetch_answer(
    zookeeper: ZooKeeperServer, tmp_path: Path
) -> None:
    zk = new_chroot(zookeeper)
    props = {i: broker_props(i, zk, tmp_path / f"b{i}") for i in (1, 2)}
    b1, b2 = (BrokerThread(props[i]).start() for i in (1, 2))
    ctl = ActingController(zk, [b1, b2])
    try:
        ctl.create_topic("div", {0: [1, 2]})
        assert produce(b1.port, "div", 0, build_values([b"both"]), acks=-1) == (0, 0)
        # Broker 2 goes; broker 1 writes a tail of epoch 0 nobody else has, then goes too.
        b2.stop()
        assert produce(b1.port, "div", 0, build_values([b"lost1", b"lost2"]), acks=1) == (0, 1)
        b1.stop()
        # Broker 2 comes back and is elected uncleanly (epoch 1), writing from offset 1.
        b2 = BrokerThread(props[2]).start()
        ctl.brokers = {2: b2}
        ctl.change_leader("div", 0, 2, [2])
        assert produce(b2.port, "div", 0, build_values([b"n1", b"n2", b"n3"]), acks=1) == (0, 1)
        seen = count_requests(b2, (ApiKey.OFFSET_FOR_LEADER_EPOCH, ApiKey.FETCH))
        # Broker 1 comes back as a follower with its epoch-0 tail (offsets 1-2).
        b1 = BrokerThread(props[1]).start()
        ctl.brokers = {1: b1, 2: b2}
        ctl.send_leader_and_isr("div", [0])
        ctl.send_update_metadata()
        wait_until(lambda: batches(b1, "div") == batches(b2, "div"), what="logs converge")
        assert batches(b1, "div") == [(0, 0, 0), (1, 3, 1)]
        fetched = b2.call(lambda: [(p.fetch_offset, p.last_fetched_epoch)
                                   for r in seen[ApiKey.FETCH] for t in r.topics
                                   for p in t.partitions])
        # Its first fetch: from its LEO (3) with its last epoch (0), answered (epoch 0, end 1).
        assert fetched[0] == (3, 0) and (1, 0) in fetched, fetched
        assert b2.call(lambda: len(seen[ApiKey.OFFSET_FOR_LEADER_EPOCH])) == 0
    finally:
        ctl.close()
        for b in (b1, b2):
            b.stop()
