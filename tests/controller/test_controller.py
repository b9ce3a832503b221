"""The ZooKeeper-elected controller against a real ZooKeeper.

Brokers are played by a small asyncio listener that registers in ZooKeeper like a broker,
records the controller requests it receives and answers them (a boundary mock: these tests are
about the controller's decisions, ZooKeeper writes and requests, not about the broker).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tidelog.broker.config import KafkaConfig
from tidelog.controller import zk_data
from tidelog.controller.admin import AdminZkClient
from tidelog.controller.controller import KafkaController
from tidelog.controller.zk_client import ControllerMovedError, KafkaZkClient
from tidelog.controller.zk_data import BrokerEndPoint, BrokerInfo, LeaderIsrAndControllerEpoch
from tidelog.protocol.api_keys import ApiKey, api_spec
from tidelog.protocol.api_versions import api_versions_response
from tidelog.protocol.codec import decode_request, encode_response
from tidelog.protocol.framing import FrameReader
from tidelog.protocol.messages.leader_and_isr import (
    LeaderAndIsrPartitionError,
    LeaderAndIsrResponse,
)
from tidelog.protocol.messages.stop_replica import StopReplicaPartitionError, StopReplicaResponse
from tidelog.protocol.messages.update_metadata import UpdateMetadataResponse
from tidelog.replication.types import TopicPartition

pytestmark = pytest.mark.timeout(120)


@dataclass
class Received:
    api_key: int
    version: int
    body: Any


@dataclass
class FakeBroker:
    """A listener that answers LeaderAndIsr / UpdateMetadata / StopReplica with success."""

    broker_id: int
    zk_connect: str
    received: list[Received] = field(default_factory=list)
    server: asyncio.AbstractServer | None = None
    zk: KafkaZkClient | None = None
    port: int = 0
    broker_epoch: int = -1
    stop_replica_errors: int = 0  # answer this many StopReplica requests with an error

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        await self.register()

    async def register(self, clean_shutdown: bool | None = None) -> None:
        self.zk = KafkaZkClient(self.zk_connect, session_timeout_ms=6000)
        await asyncio.to_thread(self.zk.start)
        info = BrokerInfo(self.broker_id, (BrokerEndPoint("PLAINTEXT", "127.0.0.1", self.port),),
                          clean_shutdown=clean_shutdown)
        self.broker_epoch = await asyncio.to_thread(self.zk.register_broker, info)

    async def deregister(self) -> None:
        """The broker's session ends: its registration disappears (a crash, to the controller)."""
        if self.zk is not None:
            await asyncio.to_thread(self.zk.close)
            self.zk = None

    async def stop(self) -> None:
        await self.deregister()
        if self.server is not None:
            self.server.close()

    def of(self, api_key: int) -> list[Any]:
        return [r.body for r in self.received if r.api_key == api_key]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader()
        try:
            while data := await reader.read(65536):
                for frame in frames.feed(data):
                    header, body = decode_request(frame)
                    key, version = header.request_api_key, header.request_api_version
                    if key == ApiKey.API_VERSIONS:
                        response: Any = api_versions_response()
                    else:
                        self.received.append(Received(key, version, body))
                        response = _answer(key, body)
                        if key == ApiKey.STOP_REPLICA and self.stop_replica_errors > 0:
                            self.stop_replica_errors -= 1
                            for e in response.partition_errors:
                                e.error_code = 56  # KAFKA_STORAGE_ERROR
                    hv = api_spec(key).response_header_version(version)
                    writer.writelines(encode_response(hv, header.correlation_id, response, version))
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def _answer(key: int, body: Any) -> Any:
    if key == ApiKey.LEADER_AND_ISR:
        errors = [LeaderAndIsrPartitionError(t.topic_name, p.partition_index, 0)
                  for t in body.topic_states for p in t.partition_states]
        return LeaderAndIsrResponse(error_code=0, partition_errors=errors)
    if key == ApiKey.UPDATE_METADATA:
        return UpdateMetadataResponse(error_code=0)
    if key == ApiKey.STOP_REPLICA:
        errors = [StopReplicaPartitionError(t.topic_name, p.partition_index, 0)
                  for t in body.topic_states for p in t.partition_states]
        return StopReplicaResponse(error_code=0, partition_errors=errors)
    raise AssertionError(f"unexpected api key {key}")


def lai_states(body: Any) -> dict[TopicPartition, Any]:
    return {TopicPartition(t.topic_name, p.partition_index): p
            for t in body.topic_states for p in t.partition_states}


async def wait_for(cond: Callable[[], Any], timeout_s: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or cond}")


def config(**overrides: Any) -> KafkaConfig:
    props = {"zookeeper.connect": "127.0.0.1:1", "auto.leader.rebalance.enable": "false"}
    props.update({k.replace("_", "."): str(v) for k, v in overrides.items()})
    return KafkaConfig(props)


class Cluster:
    """Fake brokers plus a real KafkaController on each (each with its own ZK session)."""

    def __init__(self, zk_connect: str) -> None:
        self.zk_connect = zk_connect
        self.brokers: dict[int, FakeBroker] = {}
        self.controllers: dict[int, KafkaController] = {}
        self.admin_zk = KafkaZkClient(zk_connect)

    async def start_broker(self, broker_id: int) -> FakeBroker:
        b = FakeBroker(broker_id, self.zk_connect)
        await b.start()
        self.brokers[broker_id] = b
        return b

    async def start_controller(self, broker_id: int, **cfg: Any) -> KafkaController:
        b = self.brokers[broker_id]
        assert b.zk is not None
        c = KafkaController(config(**cfg), b.zk, broker_id)
        await c.startup()
        self.controllers[broker_id] = c
        return c

    async def stop_controller(self, broker_id: int) -> None:
        c = self.controllers.pop(broker_id, None)
        if c is not None:
            await c.shutdown()

    def active(self) -> KafkaController | None:
        act = [c for c in self.controllers.values() if c.is_active]
        assert len(act) <= 1, "two active controllers in one process"
        return act[0] if act else None

    def state(self, topic: str, p: int) -> LeaderIsrAndControllerEpoch | None:
        return self.admin_zk.get_partition_state((topic, p))

    async def close(self) -> None:
        for bid in list(self.controllers):
            await self.stop_controller(bid)
        for b in self.brokers.values():
            await b.stop()
        self.admin_zk.close()


def with_cluster(scenario: Callable[[Cluster], Awaitable[None]]) -> Callable[[str], None]:
    """A test that runs `scenario` on a fresh event loop with a fresh cluster (no plugin)."""

    def test(zk_connect: str) -> None:
        async def main() -> None:
            c = Cluster(zk_connect)
            await asyncio.to_thread(c.admin_zk.start)
            try:
                await scenario(c)
            finally:
                await c.close()

        asyncio.run(main())

    test.__name__ = scenario.__name__
    test.__doc__ = scenario.__doc__
    return test


async def three_brokers(cluster: Cluster, **cfg: Any) -> KafkaController:
    for bid in (1, 2, 3):
        await cluster.start_broker(bid)
    ctl = await cluster.start_controller(1, **cfg)
    await wait_for(lambda: ctl.is_active, what="broker 1 elected")
    return ctl


async def create_topic(cluster: Cluster, name: str, assignment: dict[int, list[int]]) -> None:
    admin = AdminZkClient(cluster.admin_zk)
    await asyncio.to_thread(admin.create_topic, name, 0, 0, None, assignment)
    await wait_for(lambda: all(cluster.state(name, p) for p in assignment),
                   what=f"partition states of {name}")


# ------------------------------------------------------------------------------------ tests


@with_cluster
async def test_first_broker_wins_election_and_tells_every_broker(cluster: Cluster) -> None:
    ctl = await three_brokers(cluster)
    other = await cluster.start_controller(2)
    assert ctl.controller_epoch == 1
    assert cluster.admin_zk.get_controller_id() == 1
    assert cluster.admin_zk.get_controller_epoch() == (1, ctl.epoch_zk_version)
    await wait_for(lambda: other.active_controller_id == 1, what="standby learns the controller")
    assert not other.is_active
    for b in cluster.brokers.values():
        ums = await wait_for(lambda b=b: b.of(ApiKey.UPDATE_METADATA), what="UpdateMetadata")
        um = ums[-1]
        assert (um.controller_id, um.controller_epoch) == (1, 1)
        assert um.broker_epoch == b.broker_epoch  # KIP-380: the receiver's own epoch
        assert sorted(x.id for x in um.live_brokers) == [1, 2, 3]


@with_cluster
async def test_topic_creation_elects_first_live_replica_and_sends_leader_and_isr(
        cluster: Cluster) -> None:
    ctl = await three_brokers(cluster)
    await create_topic(cluster, "orders", {0: [2, 3, 1], 1: [3, 1, 2]})
    s0, s1 = cluster.state("orders", 0), cluster.state("orders", 1)
    assert s0 is not None and s1 is not None
    assert (s0.leader, s0.leader_epoch, s0.isr, s0.controller_epoch) == (2, 0, (2, 3, 1), 1)
    assert (s1.leader, s1.isr) == (3, (3, 1, 2))
    for bid, b in cluster.brokers.items():
        reqs = await wait_for(lambda b=b: [r for r in b.of(ApiKey.LEADER_AND_ISR)
                                           if lai_states(r)], what=f"LeaderAndIsr to {bid}")
        states = lai_states(reqs[-1])
        assert set(states) == {TopicPartition("orders", 0), TopicPartition("orders", 1)}
        p0 = states[TopicPartition("orders", 0)]
        assert (p0.leader, p0.isr, p0.replicas, p0.is_new) == (2, [2, 3, 1], [2, 3, 1], True)
        assert reqs[-1].broker_epoch == b.broker_epoch
        assert {ll.broker_id for ll in reqs[-1].live_leaders} == {2, 3}
        assert all(ll.port == cluster.brokers[ll.broker_id].port for ll in reqs[-1].live_leaders)
    assert ctl.partition_state(TopicPartition("orders", 0)).zk_version == 0  # type: ignore[union-attr]


@with_cluster
async def test_broker_loss_elects_a_new_leader_from_the_isr(cluster: Cluster) -> None:
    await three_brokers(cluster)
    await create_topic(cluster, "t", {0: [3, 2, 1], 1: [1, 3, 2]})
    b2 = cluster.brokers[2]
    before = len(b2.of(ApiKey.LEADER_AND_ISR))
    await cluster.brokers[3].deregister()
    s0 = await wait_for(lambda: (s := cluster.state("t", 0)) and s.leader != 3 and s,
                        what="new leader of t-0")
    assert (s0.leader, s0.leader_epoch, s0.isr) == (2, 1, (2, 1))
    s1 = await wait_for(lambda: (s := cluster.state("t", 1)) and 3 not in s.isr and s,
                        what="3 out of the ISR of t-1")
    assert (s1.leader, s1.leader_epoch, s1.isr) == (1, 1, (1, 2))
    reqs = await wait_for(lambda: b2.of(ApiKey.LEADER_AND_ISR)[before:], what="LeaderAndIsr")
    got = {tp: st for r in reqs for tp, st in lai_states(r).items()}
    assert (got[TopicPartition("t", 0)].leader, got[TopicPartition("t", 0)].leader_epoch) == (2, 1)
    um = await wait_for(lambda: [u for u in b2.of(ApiKey.UPDATE_METADATA)
                                 if sorted(x.id for x in u.live_brokers) == [1, 2]],
                        what="UpdateMetadata without broker 3")
    assert um


@with_cluster
async def test_last_isr_member_lost_leaves_partition_offline_until_it_returns(
        cluster: Cluster) -> None:
    await three_brokers(cluster)
    await create_topic(cluster, "solo", {0: [3]})
    await cluster.brokers[3].deregister()
    s = await wait_for(lambda: (s := cluster.state("solo", 0)) and s.leader == -1 and s,
                       what="offline partition")
    assert s.isr == (3,)  # kept, so that 3 can lead again (no unclean election)
    b3 = cluster.brokers[3]
    await b3.register()
    s = await wait_for(lambda: (s := cluster.state("solo", 0)) and s.leader == 3 and s,
                       what="3 leads again")
    assert s.leader_epoch == 2
    reqs = await wait_for(lambda: [r for r in b3.of(ApiKey.LEADER_AND_ISR)
                                   if r.broker_epoch == b3.broker_epoch], what="LAI to new 3")
    assert lai_states(reqs[-1])[TopicPartition("solo", 0)].leader == 3


@with_cluster
async def test_failover_to_a_second_controller_with_a_higher_epoch(cluster: Cluster) -> None:
    first = await three_brokers(cluster)
    second = await cluster.start_controller(2)
    await create_topic(cluster, "f", {0: [1, 2, 3]})
    await wait_for(lambda: second.active_controller_id == 1, what="standby sees controller 1")
    b3 = cluster.brokers[3]
    await cluster.stop_controller(1)
    await cluster.brokers[1].deregister()
    await wait_for(lambda: second.is_active, what="broker 2 takes over")
    assert second.controller_epoch == first.controller_epoch + 1 == 2
    assert cluster.admin_zk.get_controller_id() == 2
    s = await wait_for(lambda: (s := cluster.state("f", 0)) and s.leader == 2 and s,
                       what="leader moved off the dead broker 1")
    assert s.controller_epoch == 2 and s.isr == (2, 3)
    reqs = await wait_for(lambda: [r for r in b3.of(ApiKey.LEADER_AND_ISR)
                                   if r.controller_epoch == 2], what="LAI from controller 2")
    assert all(r.controller_id == 2 for r in reqs)


@with_cluster
async def test_brokers_hear_the_metadata_before_the_leader_and_isr(cluster: Cluster) -> None:
    """Kafka's order: a started broker gets an UpdateMetadata of every partition before the
    LeaderAndIsr of its replicas (onBrokerStartup); after a failover every broker gets one
    naming no partition, then the new controller's LeaderAndIsr (onControllerFailover)."""
    await three_brokers(cluster)
    second = await cluster.start_controller(2)
    await create_topic(cluster, "f", {0: [1, 2, 3]})
    b3 = cluster.brokers[3]
    await b3.deregister()
    await wait_for(lambda: (s := cluster.state("f", 0)) and 3 not in s.isr and s,
                   what="3 out of the ISR")
    await b3.register()

    def control(since: int, controller_epoch: int) -> list[Received]:
        got = [r for r in b3.received[since:] if r.body.controller_epoch == controller_epoch
               and r.body.broker_epoch == b3.broker_epoch]
        return got if any(r.api_key == ApiKey.LEADER_AND_ISR for r in got) else []

    got = await wait_for(lambda: control(0, 1), what="LeaderAndIsr to the started broker")
    assert [r.api_key for r in got[:2]] == [ApiKey.UPDATE_METADATA, ApiKey.LEADER_AND_ISR]
    assert set(lai_states(got[0].body)) == {TopicPartition("f", 0)}
    await wait_for(lambda: second.active_controller_id == 1, what="standby sees controller 1")
    since = len(b3.received)
    await cluster.stop_controller(1)
    got = await wait_for(lambda: control(since, 2), what="LeaderAndIsr from controller 2")
    assert [r.api_key for r in got[:2]] == [ApiKey.UPDATE_METADATA, ApiKey.LEADER_AND_ISR]
    assert lai_states(got[0].body) == {} and got[0].body.controller_id == 2


@with_cluster
async def test_stale_controller_write_is_refused_and_it_resigns(cluster: Cluster) -> None:
    ctl = await three_brokers(cluster)
    # Another controller was elected (the epoch znode moved on) before this one noticed.
    kz = cluster.admin_zk.kazoo
    await asyncio.to_thread(kz.set, zk_data.CONTROLLER_EPOCH_PATH, b"7")
    with pytest.raises(ControllerMovedError):
        await asyncio.to_thread(cluster.admin_zk.update_leader_and_isr, ("x", 0),
                                LeaderIsrAndControllerEpoch(1, 0, (1,), 1), 0,
                                ctl.epoch_zk_version)
    await asyncio.to_thread(AdminZkClient(cluster.admin_zk).create_topic, "late", 1, 1)
    await wait_for(lambda: not ctl.is_active, what="the stale controller resigns")
    await ctl.wait_idle()
    assert cluster.state("late", 0) is None  # its fenced write never landed


@with_cluster
async def test_topic_deletion_stops_and_deletes_replicas_then_removes_znodes(
        cluster: Cluster) -> None:
    await three_brokers(cluster)
    await create_topic(cluster, "gone", {0: [1, 2], 1: [2, 3]})
    await asyncio.to_thread(AdminZkClient(cluster.admin_zk).delete_topic, "gone")
    # The deletion marker goes last, after the topic's znodes (Kafka's completeDeleteTopic).
    await wait_for(lambda: not cluster.admin_zk.topic_exists("gone")
                   and cluster.admin_zk.get_topic_deletions() == set(),
                   what="znodes and the deletion marker removed")
    stops = {bid: [tuple((t.topic_name, p.partition_index, p.delete_partition)
                         for t in r.topic_states for p in t.partition_states)
                   for r in b.of(ApiKey.STOP_REPLICA)]
             for bid, b in cluster.brokers.items()}
    assert stops[1] == [(("gone", 0, True),)]
    assert stops[2] == [(("gone", 0, True), ("gone", 1, True))]
    assert stops[3] == [(("gone", 1, True),)]
    um = [u for u in cluster.brokers[1].of(ApiKey.UPDATE_METADATA)
          if any(p.leader == -2 for t in u.topic_states for p in t.partition_states)]
    assert um, "brokers are told the partitions are being deleted (leader -2)"


@with_cluster
async def test_deletion_waits_for_a_dead_replica(cluster: Cluster) -> None:
    ctl = await three_brokers(cluster)
    await create_topic(cluster, "wait", {0: [1, 3]})
    await cluster.brokers[3].deregister()
    await wait_for(lambda: 3 not in cluster.state("wait", 0).isr, what="3 out")  # type: ignore[union-attr]
    await asyncio.to_thread(AdminZkClient(cluster.admin_zk).delete_topic, "wait")
    await ctl.wait_idle()
    assert "wait" in ctl.topics_to_be_deleted  # seen, and waiting
    assert cluster.admin_zk.topic_exists("wait")
    await cluster.brokers[3].register()
    await wait_for(lambda: not cluster.admin_zk.topic_exists("wait"), what="deleted after return")


@with_cluster
async def test_controlled_shutdown_moves_leadership_off_first(cluster: Cluster) -> None:
    ctl = await three_brokers(cluster)
    await create_topic(cluster, "cs", {0: [3, 1, 2], 1: [1, 3, 2]})
    await create_topic(cluster, "cs1", {0: [3]})
    b3 = cluster.brokers[3]
    err, remaining = await ctl.controlled_shutdown(3, b3.broker_epoch)
    assert err == 0
    assert remaining == []  # cs1-0 has one replica: not counted, as in Kafka
    s0, s1 = cluster.state("cs", 0), cluster.state("cs", 1)
    assert s0 is not None and s1 is not None
    assert (s0.leader, s0.isr) == (1, (1, 2))
    assert (s1.leader, s1.isr) == (1, (1, 2))
    stops = await wait_for(lambda: b3.of(ApiKey.STOP_REPLICA), what="StopReplica to 3")
    stopped = {(t.topic_name, p.partition_index, p.delete_partition)
               for r in stops for t in r.topic_states for p in t.partition_states}
    assert stopped == {("cs", 0, False), ("cs", 1, False), ("cs1", 0, False)}
    err, _ = await ctl.controlled_shutdown(3, b3.broker_epoch - 1)
    assert err == 77  # STALE_BROKER_EPOCH
    err, _ = await ctl.controlled_shutdown(9, 1)
    assert err == 8  # BROKER_NOT_AVAILABLE
    standby = await cluster.start_controller(2)
    assert await standby.controlled_shutdown(3, b3.broker_epoch) == (41, [])  # NOT_CONTROLLER


@with_cluster
async def test_controller_events_do_not_wait_behind_the_brokers_worker_threads(
        cluster: Cluster) -> None:
    # A broker runs its ISR writes in the event loop's default executor: after a large topic's
    # creation thousands queue there. The controller's ZooKeeper calls have their own thread
    # (Kafka's controller event thread), so a controlled shutdown is handled meanwhile.
    ctl = await three_brokers(cluster)
    await create_topic(cluster, "busy", {0: [3, 1, 2]})
    release = threading.Event()
    loop = asyncio.get_running_loop()
    occupied = [loop.run_in_executor(None, release.wait, 120)
                for _ in range(min(32, (os.cpu_count() or 1) + 4))]
    try:
        err, remaining = await asyncio.wait_for(
            ctl.controlled_shutdown(3, cluster.brokers[3].broker_epoch), 60)
    finally:
        release.set()
        await asyncio.gather(*occupied)
    assert (err, remaining) == (0, [])
    s = cluster.state("busy", 0)
    assert s is not None and (s.leader, s.isr) == (1, (1, 2))


@with_cluster
async def test_isr_change_notification_becomes_update_metadata(cluster: Cluster) -> None:
    await three_brokers(cluster)
    await create_topic(cluster, "isr", {0: [1, 2, 3]})
    zk = cluster.admin_zk
    s = cluster.state("isr", 0)
    assert s is not None
    # The leader shrinks the ISR itself (CAS on the zk version) and notifies the controller.
    ok, _ = zk.update_leader_and_isr(("isr", 0), LeaderIsrAndControllerEpoch(1, 0, (1, 2), 1),
                                     s.zk_version)
    assert ok
    await asyncio.to_thread(zk.propagate_isr_changes, [("isr", 0)])
    b3 = cluster.brokers[3]
    await wait_for(lambda: [u for u in b3.of(ApiKey.UPDATE_METADATA)
                            for t in u.topic_states for p in t.partition_states
                            if t.topic_name == "isr" and p.isr == [1, 2]],
                   what="UpdateMetadata with the shrunk ISR")
    await wait_for(lambda: zk.get_all_isr_change_notifications() == [],
                   what="notifications deleted")


@with_cluster
async def test_bounced_broker_gets_requests_with_its_new_epoch(cluster: Cluster) -> None:
    await three_brokers(cluster)
    await create_topic(cluster, "b", {0: [2, 3]})
    b2 = cluster.brokers[2]
    old = b2.broker_epoch
    await b2.deregister()
    await b2.register()
    assert b2.broker_epoch > old
    reqs = await wait_for(lambda: [r for r in b2.of(ApiKey.LEADER_AND_ISR)
                                   if r.broker_epoch == b2.broker_epoch and lai_states(r)],
                          what="LeaderAndIsr with the new broker epoch")
    assert TopicPartition("b", 0) in lai_states(reqs[-1])


@with_cluster
async def test_preferred_leader_rebalance_moves_leadership_back(cluster: Cluster) -> None:
    for bid in (1, 2, 3):
        await cluster.start_broker(bid)
    ctl = await cluster.start_controller(
        1, auto_leader_rebalance_enable="true", leader_imbalance_check_interval_seconds=1)
    await wait_for(lambda: ctl.is_active, what="elected")
    await create_topic(cluster, "pref", {0: [3, 1], 1: [1, 3]})
    await cluster.brokers[3].deregister()
    await wait_for(lambda: cluster.state("pref", 0).leader == 1, what="1 leads")  # type: ignore[union-attr]
    await cluster.brokers[3].register()
    # 3 rejoins the ISR (the leader would do this after it caught up).
    s = cluster.state("pref", 0)
    assert s is not None
    ok, _ = cluster.admin_zk.update_leader_and_isr(
        ("pref", 0), LeaderIsrAndControllerEpoch(1, s.leader_epoch, (1, 3), s.controller_epoch),
        s.zk_version)
    assert ok
    await asyncio.to_thread(cluster.admin_zk.propagate_isr_changes, [("pref", 0)])
    s = await wait_for(lambda: (s := cluster.state("pref", 0)) and s.leader == 3 and s,
                       timeout_s=15, what="preferred leader 3 restored")
    assert s.isr == (1, 3) or set(s.isr) == {1, 3}
    assert ctl.imbalanced_brokers() == set()


@with_cluster
async def test_controller_shutdown_releases_the_role(cluster: Cluster) -> None:
    await three_brokers(cluster)
    second = await cluster.start_controller(3)
    await cluster.stop_controller(1)  # broker 1 stays registered; only its controller stops
    await wait_for(lambda: second.is_active, what="broker 3 takes over at once")
    assert second.controller_epoch == 2
    with contextlib.suppress(Exception):
        assert cluster.admin_zk.get_controller_id() == 3


def expire_session(zk: KafkaZkClient) -> None:
    """Expire `zk`'s session the classic way: a second client attaches to the same session
    and closes it (ZooKeeper then expires it for the first one)."""
    from kazoo.client import KazooClient

    sid, passwd = zk.kazoo.client_id
    other = KazooClient(hosts=zk.connect_string, client_id=(sid, passwd), timeout=10)
    other.start(timeout=15)
    other.stop()
    other.close()


@with_cluster
async def test_session_expiry_makes_the_controller_resign_and_campaign_again(
        cluster: Cluster) -> None:
    ctl = await three_brokers(cluster)
    standby = await cluster.start_controller(2)
    await create_topic(cluster, "exp", {0: [1, 2]})
    b1 = cluster.brokers[1]
    assert b1.zk is not None
    epoch1 = b1.broker_epoch
    await asyncio.to_thread(expire_session, b1.zk)
    # Either broker may win the new election; there is exactly one controller, with epoch 2.
    # (Until 1 handles its expiry it may still act as the epoch-1 controller, fenced.)
    def new_controller() -> KafkaController | None:
        active = [c for c in (ctl, standby) if c.is_active]
        return active[0] if len(active) == 1 and active[0].controller_epoch == 2 else None

    winner = await wait_for(new_controller, what="a new controller after the session expired")
    assert cluster.admin_zk.get_controller_id() == winner.broker_id
    # Broker 1 re-registered with a new session: a bounce, with a larger broker epoch.
    found = await wait_for(lambda: (f := cluster.admin_zk.get_broker(1)) and f[1] > epoch1 and f,
                           what="broker 1 re-registered")
    assert found[1] > epoch1
    assert winner.core is not None
    await wait_for(lambda: winner.core is not None and winner.core.live_brokers.get(1) == found[1],
                   what="the controller knows broker 1's new epoch")


@with_cluster
async def test_partition_created_without_live_replicas_gets_a_leader_when_one_starts(
        cluster: Cluster) -> None:
    ctl = await three_brokers(cluster)
    # Assigned to broker 4, which has never registered: no leader can be chosen yet.
    await asyncio.to_thread(cluster.admin_zk.create_topic, "later", {0: [4, 1]})
    s = await wait_for(lambda: cluster.state("later", 0), what="state with the live replica")
    assert (s.leader, s.isr) == (1, (1,))
    await asyncio.to_thread(cluster.admin_zk.create_topic, "lonely", {0: [4]})
    await ctl.wait_idle()
    assert "lonely" in ctl.topics  # seen
    assert cluster.state("lonely", 0) is None
    b4 = await cluster.start_broker(4)
    s = await wait_for(lambda: cluster.state("lonely", 0), what="lonely-0 initialized")
    assert (s.leader, s.leader_epoch, s.isr) == (4, 0, (4,))
    reqs = await wait_for(lambda: [r for r in b4.of(ApiKey.LEADER_AND_ISR)
                                   if TopicPartition("lonely", 0) in lai_states(r)],
                          what="LeaderAndIsr to broker 4")
    assert lai_states(reqs[-1])[TopicPartition("lonely", 0)].leader == 4


@with_cluster
async def test_unclean_election_follows_the_topic_override(cluster: Cluster) -> None:
    await three_brokers(cluster)  # broker default: unclean.leader.election.enable=false
    admin = AdminZkClient(cluster.admin_zk)
    await asyncio.to_thread(admin.create_topic, "dirty", 0, 0,
                            {"unclean.leader.election.enable": "true"}, {0: [3, 2]})
    await asyncio.to_thread(admin.create_topic, "clean", 0, 0, None, {0: [3, 2]})
    for t in ("dirty", "clean"):
        await wait_for(lambda t=t: cluster.state(t, 0), what=f"{t} online")
        s = cluster.state(t, 0)
        assert s is not None
        # The leader shrank the ISR to itself (2 fell behind).
        ok, _ = cluster.admin_zk.update_leader_and_isr(
            (t, 0), LeaderIsrAndControllerEpoch(3, s.leader_epoch, (3,), s.controller_epoch),
            s.zk_version)
        assert ok
    await asyncio.to_thread(cluster.admin_zk.propagate_isr_changes, [("dirty", 0), ("clean", 0)])
    await wait_for(lambda: cluster.admin_zk.get_all_isr_change_notifications() == [],
                   what="notifications handled")
    await cluster.brokers[3].deregister()
    dirty = await wait_for(lambda: (s := cluster.state("dirty", 0)) and s.leader == 2 and s,
                           what="unclean leader for the topic that allows it")
    assert dirty.isr == (2,)
    clean = await wait_for(lambda: (s := cluster.state("clean", 0)) and s.leader == -1 and s,
                           what="the other topic offline")
    assert clean.isr == (3,)


@with_cluster
async def test_deletion_retries_a_failed_stop_replica_a_bounded_number_of_times(
        cluster: Cluster) -> None:
    from tidelog.controller.controller import MAX_DELETION_RETRIES

    await three_brokers(cluster)
    await create_topic(cluster, "sticky", {0: [1, 2]})
    await create_topic(cluster, "flaky", {0: [2, 3]})
    b2 = cluster.brokers[2]

    def stops(topic: str) -> int:
        return sum(1 for r in b2.of(ApiKey.STOP_REPLICA)
                   if any(t.topic_name == topic for t in r.topic_states))

    b2.stop_replica_errors = 2  # two failures, then success
    await asyncio.to_thread(AdminZkClient(cluster.admin_zk).delete_topic, "flaky")
    await wait_for(lambda: not cluster.admin_zk.topic_exists("flaky"), what="flaky deleted")
    assert stops("flaky") == 3

    b2.stop_replica_errors = 10_000  # a broken disk: never succeeds
    await asyncio.to_thread(AdminZkClient(cluster.admin_zk).delete_topic, "sticky")
    await wait_for(lambda: stops("sticky") == MAX_DELETION_RETRIES + 1, timeout_s=30,
                   what="bounded retries")
    await cluster.controllers[1].wait_idle()  # no retry due, no request in flight
    assert stops("sticky") == MAX_DELETION_RETRIES + 1  # no more until a broker starts
    assert cluster.admin_zk.topic_exists("sticky")
    b2.stop_replica_errors = 0  # the disk was replaced and the broker restarted
    await b2.deregister()
    await b2.register()
    await wait_for(lambda: not cluster.admin_zk.topic_exists("sticky"),
                   what="deletion resumed after the broker restarted")


@with_cluster
async def test_decisions_use_the_state_in_zookeeper_not_a_stale_cache(cluster: Cluster) -> None:
    ctl = await three_brokers(cluster)
    await create_topic(cluster, "fresh", {0: [1, 2, 3]})
    zk = cluster.admin_zk
    s = cluster.state("fresh", 0)
    assert s is not None
    # The leader shrinks the ISR and the controller hears of it ...
    ok, v = zk.update_leader_and_isr(("fresh", 0),
                                     LeaderIsrAndControllerEpoch(1, 0, (1, 2), 1), s.zk_version)
    assert ok
    await asyncio.to_thread(zk.propagate_isr_changes, [("fresh", 0)])
    await wait_for(lambda: (p := ctl.partition_state(TopicPartition("fresh", 0))) is not None
                   and p.isr == (1, 2), what="controller sees ISR [1,2]")
    # ... then expands it again, and the notification has not arrived yet.
    ok, _ = zk.update_leader_and_isr(("fresh", 0),
                                     LeaderIsrAndControllerEpoch(1, 0, (1, 2, 3), 1), v)
    assert ok
    err, remaining = await ctl.controlled_shutdown(3, cluster.brokers[3].broker_epoch)
    assert (err, remaining) == (0, [])
    after = cluster.state("fresh", 0)
    assert after is not None and after.isr == (1, 2) and after.leader == 1


async def offline_with_only_3_in_the_isr(cluster: Cluster, topic: str) -> FakeBroker:
    """`topic`-0 on [3, 2]: 2 falls behind (ISR [3]), then 3 dies; the partition is offline."""
    await create_topic(cluster, topic, {0: [3, 2]})
    zk = cluster.admin_zk
    s = cluster.state(topic, 0)
    assert s is not None
    ok, _ = zk.update_leader_and_isr((topic, 0), LeaderIsrAndControllerEpoch(3, 0, (3,), 1),
                                     s.zk_version)
    assert ok
    await asyncio.to_thread(zk.propagate_isr_changes, [(topic, 0)])
    await wait_for(lambda: zk.get_all_isr_change_notifications() == [], what="ISR [3] known")
    b3 = cluster.brokers[3]
    await b3.deregister()
    await wait_for(lambda: (x := cluster.state(topic, 0)) and x.leader == -1, what="offline")
    return b3


@with_cluster
async def test_unclean_restart_is_no_clean_leader_candidate_even_after_failover(
        cluster: Cluster) -> None:
    import json

    from tidelog.controller.zk_data import UNCLEAN_REPLICAS_PATH

    await three_brokers(cluster)
    standby = await cluster.start_controller(2)
    b3 = await offline_with_only_3_in_the_isr(cluster, "k966")
    zk = cluster.admin_zk
    # 3 comes back after a crash: its log may have lost acknowledged records.
    await b3.register(clean_shutdown=False)
    marks = await wait_for(lambda: zk.kazoo.exists(UNCLEAN_REPLICAS_PATH)
                           and json.loads(zk.kazoo.get(UNCLEAN_REPLICAS_PATH)[0])["partitions"],
                           what="the mark persisted")
    assert marks == {"k966:0": [3]}
    await cluster.controllers[1].wait_idle()
    assert cluster.state("k966", 0).leader == -1  # type: ignore[union-attr]
    # A new controller remembers the mark, even across a later clean restart of 3.
    await cluster.stop_controller(1)
    await wait_for(lambda: standby.is_active, what="broker 2 takes over")
    assert standby.core is not None
    assert standby.core.unclean_restarted.get(TopicPartition("k966", 0)) == {3}
    await b3.deregister()
    await wait_for(lambda: standby.core is not None and 3 not in standby.core.live_brokers,
                   what="3 gone")
    await b3.register()
    await wait_for(lambda: standby.core is not None and 3 in standby.core.live_brokers,
                   what="3 back, cleanly")
    await standby.wait_idle()
    s = cluster.state("k966", 0)
    assert s is not None and s.leader == -1 and s.isr == (3,)


@with_cluster
async def test_a_broker_registered_uncleanly_just_before_a_failover_is_marked_by_the_new_controller(
        cluster: Cluster) -> None:
    await three_brokers(cluster)
    b3 = await offline_with_only_3_in_the_isr(cluster, "k966f")
    # No controller sees 3 come back after a crash: only its registration says so.
    await cluster.stop_controller(1)
    await b3.register(clean_shutdown=False)
    second = await cluster.start_controller(2)
    await wait_for(lambda: second.is_active, what="broker 2 takes over")
    await second.wait_idle()
    assert second.core is not None
    assert second.core.unclean_restarted.get(TopicPartition("k966f", 0)) == {3}
    s = cluster.state("k966f", 0)
    assert s is not None and s.leader == -1 and s.isr == (3,)  # 3 is no clean leader


@with_cluster
async def test_turning_unclean_election_on_for_a_topic_elects_its_offline_partitions(
        cluster: Cluster) -> None:
    ctl = await three_brokers(cluster)  # broker default: unclean.leader.election.enable=false
    await create_topic(cluster, "flip", {0: [3, 2]})
    s = cluster.state("flip", 0)
    assert s is not None
    ok, _ = cluster.admin_zk.update_leader_and_isr(  # the leader shrank the ISR to itself
        ("flip", 0), LeaderIsrAndControllerEpoch(3, s.leader_epoch, (3,), s.controller_epoch),
        s.zk_version)
    assert ok
    await asyncio.to_thread(cluster.admin_zk.propagate_isr_changes, [("flip", 0)])
    await wait_for(lambda: cluster.admin_zk.get_all_isr_change_notifications() == [],
                   what="notification handled")
    await cluster.brokers[3].deregister()
    offline = await wait_for(lambda: (s := cluster.state("flip", 0)) and s.leader == -1 and s,
                             what="flip-0 offline (clean election only)")
    assert offline.isr == (3,)
    ctl.on_topic_config_change("flip", {"unclean.leader.election.enable": "true"})
    elected = await wait_for(lambda: (s := cluster.state("flip", 0)) and s.leader == 2 and s,
                             what="the out-of-sync replica elected once the topic allows it")
    assert elected.isr == (2,) and elected.leader_epoch > offline.leader_epoch


@with_cluster
async def test_a_dynamic_default_unclean_election_elects_offline_partitions(
        cluster: Cluster) -> None:
    ctl = await three_brokers(cluster)  # broker default: unclean.leader.election.enable=false
    admin = AdminZkClient(cluster.admin_zk)
    await asyncio.to_thread(admin.create_topic, "follows", 0, 0, None, {0: [3, 2]})
    await asyncio.to_thread(admin.create_topic, "stays", 0, 0,
                            {"unclean.leader.election.enable": "false"}, {0: [3, 2]})
    for t in ("follows", "stays"):
        await wait_for(lambda t=t: cluster.state(t, 0), what=f"{t} online")
        s = cluster.state(t, 0)
        assert s is not None
        ok, _ = cluster.admin_zk.update_leader_and_isr(
            (t, 0), LeaderIsrAndControllerEpoch(3, s.leader_epoch, (3,), s.controller_epoch),
            s.zk_version)
        assert ok
    await asyncio.to_thread(cluster.admin_zk.propagate_isr_changes, [("follows", 0), ("stays", 0)])
    await wait_for(lambda: cluster.admin_zk.get_all_isr_change_notifications() == [],
                   what="notifications handled")
    await cluster.brokers[3].deregister()
    for t in ("follows", "stays"):
        await wait_for(lambda t=t: (s := cluster.state(t, 0)) and s.leader == -1, what=f"{t} offline")
    ctl.on_default_unclean_change(True)  # the broker's dynamic unclean.leader.election.enable
    follows = await wait_for(lambda: (s := cluster.state("follows", 0)) and s.leader == 2 and s,
                             what="the default now allows an unclean leader")
    assert follows.isr == (2,)
    await ctl.wait_idle()
    stays = cluster.state("stays", 0)
    assert stays is not None and stays.leader == -1  # its own false wins
