"""What the differential tests share: a target cluster, the pair (Kafka, tidelog), and client
helpers that turn what a client observes into plain, comparable values (error names, offsets,
shapes), never anything that differs between two correct clusters (broker ids, ports, times)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tidelog.client.connection import BrokerConnection
from tidelog.protocol.messages.alter_partition_reassignments import (
    AlterPartitionReassignmentsRequest,
    ReassignablePartition,
    ReassignableTopic,
)
from tidelog.protocol.messages.find_coordinator import FindCoordinatorRequest
from tidelog.protocol.messages.list_offsets import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from tidelog.protocol.messages.metadata import MetadataRequest, MetadataRequestTopic

T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    name: str
    bootstrap: str
    # Controlled shutdown of one broker (ids 1-3 on both clusters), and its restart: the call
    # returns once every broker's Metadata lists all of them again.
    stop_broker: Callable[[int], None]
    start_broker: Callable[[int], None]
    # The cluster's ZooKeeper (host:port), for a test that plays a broker's registration.
    zookeeper: str = ""

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def producer(self, **conf: Any) -> Producer:
        return Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0,
                         "enable.idempotence": False, **conf})

    def consumer(self, **conf: Any) -> Consumer:
        return Consumer({"bootstrap.servers": self.bootstrap,
                         "group.id": f"compat-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, **conf})


@dataclass(frozen=True)
class Pair:
    kafka: Target
    tidelog: Target

    def run(self, scenario: Callable[[Target], T]) -> tuple[T, T]:
        """The scenario against Kafka, then against tidelog: (what Kafka showed, what tidelog
        showed). Same names on both: the two clusters are separate."""
        return scenario(self.kafka), scenario(self.tidelog)

    def same(self, scenario: Callable[[Target], T]) -> T:
        """Run the scenario on both; the observations must be equal. Returns Kafka's."""
        on_kafka, on_tidelog = self.run(scenario)
        assert on_tidelog == on_kafka, f"tidelog differs from Kafka:\n kafka:   {on_kafka!r}\n" \
                                       f" tidelog: {on_tidelog!r}"
        return on_kafka


def error_name(e: BaseException) -> str:
    """A client error as Kafka's error name (TOPIC_ALREADY_EXISTS, ...)."""
    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        return str(e.args[0].name())
    raise e


def outcome(future: Any, timeout_s: float = 30.0) -> Any:
    """A future's result, or its error's name."""
    try:
        return future.result(timeout=timeout_s)
    except KafkaException as e:
        return error_name(e)


def create_topic(target: Target, topic: str, partitions: int = 1, replication_factor: int = 3,
                 config: dict[str, str] | None = None, validate_only: bool = False) -> Any:
    """CreateTopics for one topic: None on success, else the error name."""
    admin = target.admin()  # kept referenced: a destroyed client fails its futures (_DESTROY)
    fs = admin.create_topics(
        [NewTopic(topic, partitions, replication_factor, config=config or {})],
        operation_timeout=30, validate_only=validate_only)
    return outcome(fs[topic])


def topic_shape(target: Target, topic: str, timeout_s: float = 30.0,
                isr_size: int | None = None) -> Any:
    """Metadata of `topic` as a client sees it once its partitions have leaders (and, if given,
    ISRs of `isr_size`): (number of partitions, [(replicas, ISR size, leader among the
    replicas)]), or the error name.

    It asks for every topic: a Metadata request naming the topic would let the admin client
    (a producer-type handle in librdkafka) create it."""
    admin = target.admin()
    deadline = time.monotonic() + timeout_s
    while True:
        md = admin.list_topics(timeout=10).topics.get(topic)
        if md is None:
            shape: Any = "UNKNOWN_TOPIC_OR_PART"
        elif md.error is not None:
            shape = md.error.name()
        else:
            shape = (len(md.partitions),
                     [(len(p.replicas), len(p.isrs), p.leader in p.replicas)
                      for _, p in sorted(md.partitions.items())])
        settled = (not isinstance(shape, str) and shape[0] > 0
                   and all(leader and isr_size in (None, isr) for _, isr, leader in shape[1]))
        if settled or time.monotonic() >= deadline:
            return shape
        time.sleep(0.2)


def create_ready(target: Target, topic: str, partitions: int = 1, replication_factor: int = 3,
                 config: dict[str, str] | None = None) -> None:
    """Create a topic and wait until every partition has a leader (it must succeed)."""
    assert create_topic(target, topic, partitions, replication_factor, config) is None
    shape = topic_shape(target, topic)
    assert not isinstance(shape, str) and shape[0] == partitions, shape
    # Metadata may name a leader before that broker has taken the lead (its LeaderAndIsr):
    # wait until each leader answers for its partition, or an acks=0 record could be lost.
    deadline = time.monotonic() + 30
    for p in range(partitions):
        while True:
            request = ListOffsetsRequest(replica_id=-1, topics=[ListOffsetsTopic(
                topic, [ListOffsetsPartition(p, timestamp=-1)])])
            answer = raw(leader_address(target, topic, p), request, 1)
            if answer.topics[0].partitions[0].error_code == 0:
                break
            assert time.monotonic() < deadline, f"{topic}-{p}: no serving leader in time"
            time.sleep(0.1)


def produce(target: Target, topic: str, values: list[bytes], partition: int = 0,
            timestamps: list[int] | None = None, **conf: Any) -> list[tuple[str | None, int]]:
    """Produce `values` one by one; per record (error name or None, offset)."""
    p = target.producer(**conf)
    results: list[tuple[str | None, int]] = []

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        results.append((err.name() if err is not None else None, msg.offset()))

    for i, v in enumerate(values):
        kw = {"timestamp": timestamps[i]} if timestamps else {}
        p.produce(topic, value=v, partition=partition, on_delivery=on_delivery, **kw)
        p.flush(60)  # one at a time: each record's own outcome, in order
    assert len(results) == len(values)
    return results


def watermarks(target: Target, topic: str, partition: int = 0) -> tuple[int, int]:
    """(log start offset, high watermark); a consumer that has no metadata for the partition
    yet asks again (bounded)."""
    c = target.consumer()
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                low, high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                return int(low), int(high)
            except KafkaException as e:
                if error_name(e) != "_UNKNOWN_PARTITION" or time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
    finally:
        c.close()


def partition_metadata(target: Target, topic: str, partition: int = 0) -> tuple[Any, Any]:
    """(the partition's Metadata, the brokers by id) once some broker's Metadata names a live
    leader for it (a broker the controller has not told about the topic yet is asked again)."""
    admin = target.admin()
    deadline = time.monotonic() + 30
    while True:
        md = admin.list_topics(timeout=10)
        t = md.topics.get(topic)
        p = t.partitions.get(partition) if t is not None and t.error is None else None
        if p is not None and p.leader in md.brokers:
            return p, md.brokers
        assert time.monotonic() < deadline, f"{topic}-{partition}: no leader in Metadata"
        time.sleep(0.1)


def address_of(brokers: Any, broker_id: int) -> str:
    return f"{brokers[broker_id].host}:{brokers[broker_id].port}"


def leader_address(target: Target, topic: str, partition: int = 0) -> str:
    p, brokers = partition_metadata(target, topic, partition)
    return address_of(brokers, p.leader)


def advertised(address: str, api_key: int) -> bool:
    """Whether the broker's ApiVersions lists `api_key`."""
    async def go() -> bool:
        host, port = address.rsplit(":", 1)
        conn = BrokerConnection(host, int(port), request_timeout_ms=30000)
        await conn.connect(timeout_s=10)
        try:
            return conn.api_version_range(api_key) is not None
        finally:
            await conn.close()

    return asyncio.run(go())


def until(condition: Callable[[], Any], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not in {timeout_s} s"
        time.sleep(0.2)


def raw(address: str, request: Any, api_version: int, request_timeout_ms: int = 30000) -> Any:
    """One request at a fixed version (the same on both clusters) to one broker; the response."""
    async def go() -> Any:
        host, port = address.rsplit(":", 1)
        conn = BrokerConnection(host, int(port), request_timeout_ms=request_timeout_ms)
        await conn.connect(timeout_s=10)
        try:
            return await conn.send(request, api_version)
        finally:
            await conn.close()

    return asyncio.run(go())


def coordinator(t: Target, group: str, timeout_s: float = 60.0, key_type: int = 0) -> str:
    """The group's coordinator (FindCoordinator v3; the first lookup creates __consumer_offsets
    and answers COORDINATOR_NOT_AVAILABLE until it is ready); key_type 1: a transactional id's
    (and __transaction_state)."""
    deadline = time.monotonic() + timeout_s
    first = t.bootstrap.split(",")[0]
    while True:
        r = raw(first, FindCoordinatorRequest(key=group, key_type=key_type), 3)
        if r.error_code == 0:
            return f"{r.host}:{r.port}"
        assert time.monotonic() < deadline, f"no coordinator for {group}: {r}"
        time.sleep(0.5)


def topic_id_of(address: str, topic: str) -> uuid.UUID:
    """The topic's id in that broker's Metadata (v12), ZERO_UUID once it does not know it."""
    r = raw(address, MetadataRequest(topics=[MetadataRequestTopic(name=topic)],
                                     allow_auto_topic_creation=False), 12)
    topic_id = r.topics[0].topic_id
    assert isinstance(topic_id, uuid.UUID)
    return topic_id


def reassign(target: Target, topic: str, replicas: list[int], partition: int = 0) -> None:
    """AlterPartitionReassignments of one partition at the controller (it must be accepted)."""
    md = target.admin().list_topics(timeout=10)
    ctl = md.brokers[md.controller_id]
    r = raw(f"{ctl.host}:{ctl.port}", AlterPartitionReassignmentsRequest(topics=[
        ReassignableTopic(topic, [ReassignablePartition(partition, replicas)])]), 0)
    assert r.error_code == 0 and r.responses[0].partitions[0].error_code == 0, r
