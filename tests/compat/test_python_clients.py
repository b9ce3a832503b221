"""kafka-python and aiokafka (the versions pyproject.toml's test extra installs) against Kafka and
against tidelog: the same produce, consume, consumer-group and admin calls, and what each client
shows of them (results, offsets, error class names, group states) must be equal."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from aiokafka.structs import TopicPartition as AioTopicPartition
from differential import Pair, Target
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import (
    ConfigResource,
    ConfigResourceType,
    KafkaAdminClient,
    NewPartitions,
    NewTopic,
)
from known_differences import ABSENT_TOPIC_KEYS

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _error(e: BaseException) -> str:
    return type(e).__name__


def attempt(call: Any) -> Any:
    """The call's result, or the class name of the error it raised."""
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - the error's class is what is compared
        return _error(e)


# Fields that differ between two correct clusters (ids, hosts, brokers): compared by presence.
VOLATILE = {"topic_id", "member_id", "client_id", "client_host", "host", "port", "node_id",
            "coordinator", "coordinator_id", "throttle_time_ms", "authorized_operations",
            "member_metadata", "member_assignment", "group_instance_id"}


# Fields of API versions Kafka 3.9 serves and tidelog does not (ListGroups v5's group_type):
# left out.
NEWER_VERSIONS_ONLY = {"group_type"}


def plain(x: Any) -> Any:
    """A client's answer as plain values, volatile fields as whether they are set."""
    if isinstance(x, dict):
        return {str(k): (v not in (None, "", "00000000-0000-0000-0000-000000000000")
                         if k in VOLATILE else plain(v)) for k, v in x.items()
                if k not in NEWER_VERSIONS_ONLY}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    if hasattr(x, "__dict__") and not isinstance(x, type):
        return plain({k: v for k, v in vars(x).items() if not k.startswith("_")})
    return x


def kafka_python(t: Target) -> dict[str, Any]:
    topic, group = "kafka-python", "kafka-python-group"  # the clusters are separate
    out: dict[str, Any] = {}
    admin = KafkaAdminClient(bootstrap_servers=t.bootstrap, request_timeout_ms=30000)
    try:
        def create(name: str, partitions: int, rf: int, **configs: str) -> Any:
            r = admin.create_topics([NewTopic(name, partitions, rf, topic_configs=configs)],
                                    timeout_ms=30000, wait_for_metadata=True)
            return plain(r)
        out["create"] = attempt(lambda: create(topic, 3, 3, **{"retention.ms": "3600000"}))
        out["create existing"] = attempt(lambda: create(topic, 3, 3))
        out["create replication factor 4"] = attempt(lambda: create(f"{topic}-rf", 1, 4))
        out["create invalid config"] = attempt(
            lambda: create(f"{topic}-cfg", 1, 3, **{"cleanup.policy": "sideways"}))
        out["create invalid name"] = attempt(lambda: create("bad name", 1, 3))
        # A broker not yet told of the new topic answers it unknown (an empty list): ask again.
        deadline = time.monotonic() + 30
        while not (described := plain(admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all"))
                ).get("topic", {}).get(topic) and time.monotonic() < deadline:
            time.sleep(0.2)
        out["describe_configs"] = described
        out["create_partitions to 4"] = attempt(lambda: plain(
            admin.create_partitions({topic: NewPartitions(4)}, timeout_ms=30000)))
        out["create_partitions to 2"] = attempt(lambda: plain(
            admin.create_partitions({topic: NewPartitions(2)}, timeout_ms=30000)))

        producer = KafkaProducer(bootstrap_servers=t.bootstrap, acks="all", linger_ms=0)
        sent = [producer.send(topic, key=f"k{i}".encode(), value=b"v%d" % i, partition=i % 3)
                for i in range(9)]
        out["produce acks=all"] = [(m.partition, m.offset) for m in
                                   (f.get(timeout=30) for f in sent)]
        producer.close()

        consumer = KafkaConsumer(topic, bootstrap_servers=t.bootstrap, group_id=group,
                                 enable_auto_commit=False, auto_offset_reset="earliest")
        got: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 60
        while len(got) < 9 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                got.extend((r.partition, r.offset, r.value) for r in records)
        out["consume"] = sorted(got)
        out["assignment"] = sorted(tp.partition for tp in consumer.assignment())
        consumer.commit()
        out["committed"] = [consumer.committed(TopicPartition(topic, p)) for p in range(4)]
        out["group while consuming"] = plain(admin.describe_groups([group]))
        consumer.close()
        out["group after close"] = plain(admin.describe_groups([group]))
        out["group offsets"] = attempt(lambda: plain(admin.list_group_offsets({group: None})))
        out["list_groups"] = [plain(g) for g in admin.list_groups()
                              if group in str(plain(g))]
        out["delete_groups"] = attempt(lambda: plain(admin.delete_groups([group])))
        out["delete_groups again"] = attempt(lambda: plain(admin.delete_groups([group])))
        out["delete_topics"] = attempt(lambda: [
            (x["name"] == topic, x["error_code"])
            for x in admin.delete_topics([topic], timeout_ms=30000)["topics"]])
        out["delete_topics again"] = attempt(
            lambda: admin.delete_topics([topic], timeout_ms=30000))
    finally:
        admin.close()
    return out


def aiokafka_scenario(t: Target) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        topic, group = "aiokafka", "aiokafka-group"
        out: dict[str, Any] = {}
        admin = AIOKafkaAdminClient(bootstrap_servers=t.bootstrap, request_timeout_ms=30000)
        await admin.start()
        try:
            async def create(name: str, partitions: int, rf: int) -> Any:
                try:
                    r = await admin.create_topics([AioNewTopic(name, partitions, rf)],
                                                  timeout_ms=30000)
                    return [(e[0], e[1]) for e in r.topic_errors]
                except Exception as e:  # noqa: BLE001
                    return _error(e)
            out["create"] = await create(topic, 3, 3)
            out["create existing"] = await create(topic, 3, 3)
            out["create replication factor 4"] = await create(f"{topic}-rf", 1, 4)
            deadline = time.monotonic() + 30
            while topic not in await admin.list_topics():
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)

            producer = AIOKafkaProducer(bootstrap_servers=t.bootstrap, acks="all",
                                        enable_idempotence=True)
            await producer.start()
            try:
                sent = [await producer.send_and_wait(topic, b"v%d" % i, key=b"k%d" % i,
                                                     partition=i % 3) for i in range(9)]
                out["produce idempotent acks=all"] = [(m.partition, m.offset) for m in sent]
            finally:
                await producer.stop()

            consumer = AIOKafkaConsumer(topic, bootstrap_servers=t.bootstrap, group_id=group,
                                        enable_auto_commit=False, auto_offset_reset="earliest")
            await consumer.start()
            try:
                got: list[tuple[int, int, bytes]] = []
                deadline = time.monotonic() + 60
                while len(got) < 9 and time.monotonic() < deadline:
                    batches = await consumer.getmany(timeout_ms=1000)
                    got.extend((r.partition, r.offset, r.value)
                               for records in batches.values() for r in records)
                out["consume"] = sorted(got)
                await consumer.commit()
                out["committed"] = [await consumer.committed(AioTopicPartition(topic, p))
                                    for p in range(3)]
                end = await consumer.end_offsets([AioTopicPartition(topic, p) for p in range(3)])
                out["end_offsets"] = sorted((tp.partition, o) for tp, o in end.items())
            finally:
                await consumer.stop()
            groups = await admin.describe_consumer_groups([group])
            # (error code, group id, state, protocol type, protocol, members, ...)
            out["group after stop"] = [(g[0], g[1] == group, g[2], g[3], g[4], len(g[5]))
                                       for d in groups for g in d.groups]
            offsets = await admin.list_consumer_group_offsets(group)
            out["group offsets"] = sorted((tp.partition, m.offset) for tp, m in offsets.items())
            deleted = await admin.delete_topics([topic], timeout_ms=30000)
            out["delete_topics"] = [(name == topic, code)
                                    for name, code, *_ in deleted.topic_error_codes]
        finally:
            await admin.close()
        return out

    return asyncio.run(go())


def _absent_keys_set_aside(observed: dict[str, Any]) -> tuple[set[str], set[str]]:
    """Take the documented absent topic keys out of CreateTopics' and DescribeConfigs' lists;
    the ones each listed."""
    created = observed["create"]["topics"][0]["configs"]
    described = observed["describe_configs"]["topic"]["kafka-python"]
    return ({k for k in ABSENT_TOPIC_KEYS if created.pop(k, None) is not None},
            {k for k in ABSENT_TOPIC_KEYS if described.pop(k, None) is not None})


def _documentation_set_aside(observed: dict[str, Any]) -> dict[str, str]:
    """Take DescribeConfigs' documentation fields out; the ones that were set."""
    described = observed["describe_configs"]["topic"]["kafka-python"]
    docs = {k: e.pop("documentation") for k, e in described.items()}
    return {k: d for k, d in docs.items() if d is not None}


def test_kafka_python(pair: Pair) -> None:
    on_kafka, on_tidelog = pair.run(kafka_python)
    # Not asked for documentation, Kafka sends none; tidelog notes the keys it takes only at
    # their default (known_differences.py).
    tidelog_notes = _documentation_set_aside(on_tidelog)
    assert _documentation_set_aside(on_kafka) == {}
    assert tidelog_notes and all(d.startswith("tidelog accepts only the default")
                                 for d in tidelog_notes.values())
    # CreateTopics v7 lists every config of the new topic: all of Kafka's but the documented
    # absent keys (known_differences.py), which only Kafka lists.
    every = set(ABSENT_TOPIC_KEYS)
    assert (_absent_keys_set_aside(on_kafka), _absent_keys_set_aside(on_tidelog)) == (
        (every, every), (set(), set()))
    assert on_tidelog == on_kafka
    assert len(on_kafka["consume"]) == 9
    assert on_kafka["create existing"] == "TopicAlreadyExistsError"
    assert on_kafka["create"]["topics"][0]["configs"]["retention.ms"]["config_source"] \
        == "DYNAMIC_TOPIC_CONFIG"


def test_aiokafka(pair: Pair) -> None:
    got = pair.same(aiokafka_scenario)
    assert len(got["consume"]) == 9
    assert got["create existing"] == [("aiokafka", 36)]  # TOPIC_ALREADY_EXISTS
