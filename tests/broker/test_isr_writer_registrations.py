"""The leader's ISR writer (ZkAlterPartitionManager) against a real ZooKeeper: the KIP-903
check of the members' broker epochs holds at the write, not only when /brokers/ids was read.
A member that re-registers (a new ephemeral znode: same path, same data version 0, a new
czxid) or whose registration goes between the check and the compare-and-set makes the write
fail, as KRaft's controller, which checks and writes in one step, would refuse it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tidelog.broker.replica_manager import ZkAlterPartitionManager
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.controller.zk_data import BrokerEndPoint, BrokerInfo, LeaderIsrAndControllerEpoch
from tidelog.replication.types import ProposeIsr, TopicPartition

pytestmark = pytest.mark.integration

TP = TopicPartition("orders", 0)


def broker(broker_id: int) -> BrokerInfo:
    return BrokerInfo(broker_id, (BrokerEndPoint("PLAINTEXT", "127.0.0.1", 9090 + broker_id),))


class _LeaderZk(KafkaZkClient):
    """The leader's client; ``before_write`` runs between the ISR writer's check of the
    registrations and its compare-and-set (the window under test)."""

    before_write: Callable[[], None] = staticmethod(lambda: None)

    def update_isrs_registered(self, *args: Any, **kwargs: Any) -> Any:
        self.before_write()
        return super().update_isrs_registered(*args, **kwargs)


@pytest.fixture
def clients(zk_connect: str) -> Iterator[Callable[..., KafkaZkClient]]:
    made: list[KafkaZkClient] = []

    def make(cls: type[KafkaZkClient] = KafkaZkClient) -> KafkaZkClient:
        client = cls(zk_connect, session_timeout_ms=6000).start()
        made.append(client)
        return client

    yield make
    for c in made:
        c.close()


def write_isr(writer: ZkAlterPartitionManager, prop: ProposeIsr) -> tuple[bool, int]:
    async def go() -> tuple[bool, int]:
        done: asyncio.Future[tuple[bool, int]] = asyncio.get_running_loop().create_future()
        writer.submit(prop, lambda ok, version: done.set_result((ok, version)))
        return await asyncio.wait_for(done, 30)

    return asyncio.run(go())


def setup(clients: Callable[..., KafkaZkClient]) -> tuple[_LeaderZk, KafkaZkClient, ProposeIsr]:
    """Broker 1 leads orders-0 with ISR [1]; broker 2 (registered) is proposed to join."""
    leader = clients(_LeaderZk)
    assert isinstance(leader, _LeaderZk)
    leader_epoch = leader.register_broker(broker(1))
    _, _, epoch_version = leader.try_elect_controller(1)
    leader.create_topic(TP.topic, {0: [1, 2]})
    leader.create_partition_state((TP.topic, 0), LeaderIsrAndControllerEpoch(1, 0, (1,), 1),
                                  epoch_version)
    follower = clients()
    follower_epoch = follower.register_broker(broker(2))
    prop = ProposeIsr(TP, leader=1, leader_epoch=0, new_isr=(1, 2), zk_version=0,
                      controller_epoch=1,
                      isr_with_broker_epochs=((1, leader_epoch), (2, follower_epoch)))
    return leader, follower, prop


def isr(client: KafkaZkClient) -> tuple[int, ...]:
    state = client.get_partition_state((TP.topic, 0))
    assert state is not None
    return tuple(state.isr)


def test_the_member_epochs_checked_are_those_at_the_write(
        clients: Callable[..., KafkaZkClient]) -> None:
    leader, _, prop = setup(clients)
    assert write_isr(ZkAlterPartitionManager(leader), prop) == (True, 1)
    assert isr(leader) == (1, 2)


def test_a_member_re_registering_between_the_check_and_the_write_is_not_written(
        clients: Callable[..., KafkaZkClient]) -> None:
    leader, follower, prop = setup(clients)
    old_node = leader.kazoo.exists("/brokers/ids/2")

    def restart_broker_2() -> None:  # its old process's fetch is what the leader proposes
        follower.close()
        clients().register_broker(broker(2))

    leader.before_write = restart_broker_2
    writer = ZkAlterPartitionManager(leader)
    assert write_isr(writer, prop) == (False, -1)
    assert isr(leader) == (1,) and writer.registration_changed_refused == 1
    assert writer.ineligible_refused == 0
    # What a check of the member's own znode could not have seen: the same version.
    new_node = leader.kazoo.exists("/brokers/ids/2")
    assert new_node.version == old_node.version and new_node.czxid > old_node.czxid


def test_a_member_deregistering_between_the_check_and_the_write_is_not_written(
        clients: Callable[..., KafkaZkClient]) -> None:
    leader, follower, prop = setup(clients)
    leader.before_write = follower.close
    writer = ZkAlterPartitionManager(leader)
    assert write_isr(writer, prop) == (False, -1)
    assert isr(leader) == (1,)


def test_proposals_made_together_are_written_in_one_batch_each_with_its_own_answer(
        clients: Callable[..., KafkaZkClient]) -> None:
    """A restarted follower rejoins the ISRs of all the partitions it follows at once: one
    registrations read and pipelined compare-and-sets; a lost compare-and-set fails only its
    own write."""
    leader, _, prop = setup(clients)
    controller_epoch = leader.get_controller_epoch()
    assert controller_epoch is not None
    epoch_version = controller_epoch[1]
    n = 250
    leader.create_topic("many", {p: [1, 2] for p in range(n)})
    for p in range(n):
        leader.create_partition_state(("many", p), LeaderIsrAndControllerEpoch(1, 0, (1,), 1),
                                      epoch_version)
    props = [ProposeIsr(TopicPartition("many", p), leader=1, leader_epoch=0, new_isr=(1, 2),
                        zk_version=1 if p == 7 else 0,  # 7: a stale version
                        controller_epoch=1, isr_with_broker_epochs=prop.isr_with_broker_epochs)
             for p in range(n)]
    writer = ZkAlterPartitionManager(leader)

    async def go() -> list[tuple[bool, int]]:
        loop = asyncio.get_running_loop()
        answers = [loop.create_future() for _ in props]
        for pr, answer in zip(props, answers, strict=True):
            writer.submit(pr, lambda ok, version, a=answer: a.set_result((ok, version)))
        return list(await asyncio.wait_for(asyncio.gather(*answers), 30))

    answers = asyncio.run(go())
    assert writer.batches_written == 1
    assert answers == [(False, -1) if p == 7 else (True, 1) for p in range(n)]
    states = leader.get_partition_states([("many", p) for p in range(n)])
    assert [tuple(states[("many", p)].isr) for p in range(n)] == [
        (1,) if p == 7 else (1, 2) for p in range(n)]
