"""Test harness: real `BrokerServer`s on their own event loops (one thread each), and a test
acting as the controller (writes partition states to ZooKeeper and sends LeaderAndIsr /
UpdateMetadata over the wire, as Kafka's controller does; the leaders' AlterPartition requests
are decided by the controller's own code, `DecisionExecutor.alter_partition`).

Brokers run in threads so that blocking clients (confluent-kafka, kafka-python) can be used from
the test thread while the broker serves.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from waiting import wait_until as wait_until  # the broker tests' barrier, shared

from tidelog.broker.alter_partition import handle_alter_partition
from tidelog.broker.config import KafkaConfig
from tidelog.broker.server import BrokerServer
from tidelog.client.connection import BrokerConnection
from tidelog.controller.core import ControllerCore
from tidelog.controller.executor import AlterPartitionOutcome, DecisionExecutor
from tidelog.controller.zk_client import KafkaZkClient
from tidelog.controller.zk_data import LeaderIsrAndControllerEpoch
from tidelog.protocol.api_keys import ApiKey
from tidelog.protocol.messages import leader_and_isr as m_lai
from tidelog.protocol.messages import update_metadata as m_um
from tidelog.replication.types import ProposeIsr, TopicPartition

T = TypeVar("T")


def broker_props(broker_id: int, zk_connect: str, log_dir: Path, **extra: Any) -> dict[str, str]:
    props = {
        "broker.id": str(broker_id),
        "zookeeper.connect": zk_connect,
        "listeners": "PLAINTEXT://127.0.0.1:0",
        "log.dirs": str(log_dir),
        "zookeeper.session.timeout.ms": "6000",
        "controlled.shutdown.enable": "false",
        "replica.fetch.wait.max.ms": "200",
        "replica.fetch.backoff.ms": "100",
    }
    props.update({k.replace("_", "."): str(v) for k, v in extra.items()})
    return props


class BrokerThread:
    """A BrokerServer running on a private event loop in a daemon thread."""

    def __init__(self, props: Mapping[str, str], controller_factory: Any = None) -> None:
        self.props = dict(props)
        self.config = KafkaConfig(self.props)
        self.loop = asyncio.new_event_loop()
        self.server = BrokerServer(self.config, controller_factory=controller_factory)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T], timeout: float = 10) -> T:
        """Run a plain function on the broker's loop (to read its state safely)."""
        async def wrap() -> T:
            return fn()
        return self.run(wrap(), timeout)

    def start(self) -> BrokerThread:
        self.run(self.server.startup(), timeout=60)
        return self

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        try:
            if self.loop.is_running():
                self.run(self.server.shutdown(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            if not self.loop.is_running():
                self.loop.close()

    @property
    def broker_id(self) -> int:
        return self.server.broker_id

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def partition(self, topic: str, partition: int) -> Any:
        from tidelog.replication.types import TopicPartition

        return self.call(lambda: self.server.replica_manager.core.partition(TopicPartition(topic, partition)))


async def request(port: int, req: Any, api_version: int | None = None, timeout_ms: int = 15000) -> Any:
    conn = BrokerConnection("127.0.0.1", port, request_timeout_ms=timeout_ms)
    await conn.connect()
    try:
        return await conn.send(req, api_version)
    finally:
        await conn.close()


def send(port: int, req: Any, api_version: int | None = None, timeout_ms: int = 15000) -> Any:
    """One request over a fresh tidelog BrokerConnection, from a sync test."""
    return asyncio.run(request(port, req, api_version, timeout_ms))


class _AlterPartitionHook:
    """What the broker the acting controller names as controller does with AlterPartition
    (its KafkaApis handler: broker/alter_partition.py over this in place of a controller):
    `ActingController.alter_partition`. Its other controller requests are not served."""

    is_active = True

    def __init__(self, acting: ActingController) -> None:
        self.acting = acting
        self.requests = 0

    @property
    def topic_ids(self) -> dict[str, uuid.UUID]:
        return self.acting.topic_ids

    async def alter_partition(self, broker_id: int, broker_epoch: int,
                              proposals: list[ProposeIsr]) -> AlterPartitionOutcome:
        self.requests += 1
        return await asyncio.to_thread(self.acting.alter_partition, broker_id, broker_epoch,
                                       proposals)


class ActingController:
    """The test plays Kafka's controller: ZooKeeper state + LeaderAndIsr/UpdateMetadata."""

    def __init__(self, zk_connect: str, brokers: Sequence[BrokerThread], controller_epoch: int = 1) -> None:
        self.zk = KafkaZkClient(zk_connect, session_timeout_ms=6000).start()
        self.brokers = {b.broker_id: b for b in brokers}
        self.controller_epoch = controller_epoch
        self.controller_id = min(self.brokers)
        self.states: dict[tuple[str, int], dict[str, Any]] = {}
        self.topic_ids: dict[str, uuid.UUID] = {}
        self.alter_partition_hook = _AlterPartitionHook(self)
        controller_broker = self.brokers[self.controller_id]
        if controller_broker.server.controller is None:
            hook = self.alter_partition_hook

            async def alter_partition(ctx: Any, request: Any) -> Any:
                return await handle_alter_partition(hook, request, ctx.api_version)

            controller_broker.server.apis.register_handler(ApiKey.ALTER_PARTITION,
                                                           alter_partition)
        self._lock = threading.Lock()

    def alter_partition(self, broker_id: int, broker_epoch: int,
                        proposals: Sequence[ProposeIsr]) -> AlterPartitionOutcome:
        """A leader's AlterPartition, decided by the controller's code on the registrations and
        partition states in ZooKeeper; the written states are announced by UpdateMetadata."""
        with self._lock:
            core = ControllerCore(self.controller_id, self.controller_epoch)
            core.live_brokers = {b: epoch for b, (_, epoch)
                                 in self.zk.get_all_brokers_and_epochs().items()}
            for (topic, p), s in self.states.items():
                core.add_partition(TopicPartition(topic, p), s["replicas"])
            executor = DecisionExecutor(self.zk, core, None)
            executor.refresh([prop.tp for prop in proposals])
            outcome = executor.alter_partition(broker_id, broker_epoch, proposals)
            for tp in outcome.written:
                st = core.partition_states[tp]
                self.states[(tp.topic, tp.partition)].update(
                    leader=st.leader, isr=list(st.isr), zk_version=st.zk_version)
            if outcome.written:  # to the brokers registered (a stopped one is not)
                self.send_update_metadata(live=set(core.live_brokers))
            return outcome

    def close(self) -> None:
        self.zk.close()

    def broker_epochs(self) -> dict[int, int]:
        return {bid: b.server.broker_epoch for bid, b in self.brokers.items()}

    def create_topic(self, topic: str, assignment: Mapping[int, Sequence[int]],
                     config: Mapping[str, Any] | None = None, write_assignment: bool = True,
                     live: Sequence[int] | None = None, isr: Sequence[int] | None = None) -> None:
        if write_assignment:
            self.zk.create_topic(topic, assignment, config or {})
        self.topic_ids.setdefault(topic, uuid.uuid4())
        live_ids = set(live) if live is not None else set(self.brokers)
        for p, replicas in assignment.items():
            leader = next((r for r in replicas if r in live_ids), -1)
            in_sync = tuple(r for r in (isr if isr is not None else replicas) if r in live_ids)
            st = LeaderIsrAndControllerEpoch(leader, 0, in_sync, self.controller_epoch)
            self.zk.create_partition_state((topic, p), st)
            self.states[(topic, p)] = {"leader": leader, "leader_epoch": 0, "isr": list(in_sync),
                                       "zk_version": 0, "replicas": list(replicas)}
        self.send_leader_and_isr(topic, [p for p in assignment], live=live_ids)
        self.send_update_metadata(live=live_ids)

    def read_state(self, topic: str, partition: int) -> LeaderIsrAndControllerEpoch | None:
        return self.zk.get_partition_state((topic, partition))

    def change_leader(self, topic: str, partition: int, leader: int, isr: Sequence[int]) -> None:
        """A new leader epoch written to ZooKeeper (as an election would) and announced."""
        current = self.zk.get_partition_state((topic, partition))
        assert current is not None
        st = LeaderIsrAndControllerEpoch(leader, current.leader_epoch + 1, tuple(isr), self.controller_epoch)
        ok, version = self.zk.update_leader_and_isr((topic, partition), st, current.zk_version)
        assert ok
        self.states[(topic, partition)].update(leader=leader, leader_epoch=current.leader_epoch + 1,
                                               isr=list(isr), zk_version=version)
        self.send_leader_and_isr(topic, [partition])
        self.send_update_metadata()

    def _live(self, live: set[int] | None) -> list[BrokerThread]:
        return [b for bid, b in self.brokers.items() if live is None or bid in live]

    def send_leader_and_isr(self, topic: str, partitions: Sequence[int], live: set[int] | None = None,
                            api_version: int | None = None, broker_epoch: int | None = None) -> dict[int, Any]:
        out = {}
        for b in self._live(live):
            states = []
            for p in partitions:
                s = self.states[(topic, p)]
                if b.broker_id not in s["replicas"]:
                    continue
                states.append(m_lai.LeaderAndIsrPartitionState(
                    topic_name=topic, partition_index=p, controller_epoch=self.controller_epoch,
                    leader=s["leader"], leader_epoch=s["leader_epoch"], isr=list(s["isr"]),
                    partition_epoch=s["zk_version"], replicas=list(s["replicas"]), is_new=True,
                    adding_replicas=list(s.get("adding_replicas", ())),
                    removing_replicas=list(s.get("removing_replicas", ())),
                ))
            if not states:
                continue
            leaders = {states_i.leader for states_i in states}
            live_leaders = [
                m_lai.LeaderAndIsrLiveLeader(lid, "127.0.0.1", self.brokers[lid].port)
                for lid in sorted(leaders) if lid in self.brokers
            ]
            v = api_version
            req = m_lai.LeaderAndIsrRequest(
                controller_id=self.controller_id, controller_epoch=self.controller_epoch,
                broker_epoch=b.server.broker_epoch if broker_epoch is None else broker_epoch,
                live_leaders=live_leaders,
            )
            if v is not None and v < 2:
                req.ungrouped_partition_states = states
            else:
                req.topic_states = [m_lai.LeaderAndIsrTopicState(topic, self.topic_ids[topic], states)]
            out[b.broker_id] = send(b.port, req, v)
        return out

    def send_update_metadata(self, live: set[int] | None = None) -> None:
        brokers = self._live(live)
        live_brokers = [
            m_um.UpdateMetadataBroker(
                id=b.broker_id, v0_host="127.0.0.1", v0_port=b.port,
                endpoints=[m_um.UpdateMetadataEndpoint(b.port, "127.0.0.1", "PLAINTEXT", 0)],
                rack=None,
            )
            for b in brokers
        ]
        by_topic: dict[str, list[Any]] = {}
        for (topic, p), s in sorted(self.states.items()):
            by_topic.setdefault(topic, []).append(m_um.UpdateMetadataPartitionState(
                topic_name=topic, partition_index=p, controller_epoch=self.controller_epoch,
                leader=s["leader"], leader_epoch=s["leader_epoch"], isr=list(s["isr"]),
                zk_version=s["zk_version"], replicas=list(s["replicas"]), offline_replicas=[],
            ))
        for b in brokers:
            req = m_um.UpdateMetadataRequest(
                controller_id=self.controller_id, controller_epoch=self.controller_epoch,
                broker_epoch=b.server.broker_epoch,
                topic_states=[m_um.UpdateMetadataTopicState(t, self.topic_ids.get(t, uuid.UUID(int=0)), ps)
                              for t, ps in by_topic.items()],
                live_brokers=live_brokers,
            )
            resp = send(b.port, req)
            assert resp.error_code == 0, resp


# ---------------------------------------------------------------- wire request shorthands


def produce_request(topic: str, partition: int, records: Any, acks: int = -1,
                    timeout_ms: int = 10000, transactional_id: str | None = None) -> Any:
    from tidelog.protocol.messages.produce import (
        PartitionProduceData,
        ProduceRequest,
        TopicProduceData,
    )

    return ProduceRequest(acks=acks, timeout_ms=timeout_ms, transactional_id=transactional_id,
                          topic_data=[
        TopicProduceData(topic, [PartitionProduceData(partition, bytes(records) if records is not None else None)])
    ])


def produce(port: int, topic: str, partition: int, records: Any, acks: int = -1,
            timeout_ms: int = 10000, api_version: int | None = None,
            transactional_id: str | None = None) -> Any:
    """(error_code, base_offset) of a one-partition produce (transactional batches need a
    `transactional_id`, as Kafka refuses them without one)."""
    resp = send(port, produce_request(topic, partition, records, acks, timeout_ms,
                                      transactional_id), api_version,
                timeout_ms=timeout_ms + 10000)
    p = resp.responses[0].partition_responses[0]
    return p.error_code, p.base_offset


def fetch_request(topic: str, partition: int, offset: int, *, replica_id: int = -1,
                  max_wait_ms: int = 0, min_bytes: int = 1, max_bytes: int = 1 << 20,
                  current_leader_epoch: int = -1) -> Any:
    from tidelog.protocol.messages.fetch import FetchPartition, FetchRequest, FetchTopic

    return FetchRequest(replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                        max_bytes=max_bytes, topics=[FetchTopic(topic=topic, partitions=[
                            FetchPartition(partition=partition, fetch_offset=offset,
                                           current_leader_epoch=current_leader_epoch,
                                           partition_max_bytes=max_bytes)])])


def fetch(port: int, topic: str, partition: int, offset: int, **kwargs: Any) -> Any:
    """The PartitionData of a one-partition fetch."""
    resp = send(port, fetch_request(topic, partition, offset, **kwargs))
    return resp.responses[0].partitions[0]


def values_of(records: Any) -> list[bytes]:
    from tidelog.protocol.records.decoder import iter_records  # type: ignore[attr-defined]

    return [r.value for r in iter_records(bytes(records))]
