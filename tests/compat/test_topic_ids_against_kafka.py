"""Topic ids (KIP-516) as clients see them: a random id at creation, the same on every broker,
a new one for a topic deleted and created again (so that a client can tell them apart)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import TopicCollection
from differential import Pair, Target, create_ready, create_topic, outcome, raw, topic_shape

from tidelog.protocol.messages.metadata import MetadataRequest, MetadataRequestTopic
from tidelog.protocol.primitives import ZERO_UUID

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _ids_by_broker(t: Target, topic: str) -> set[object]:
    """The topic's id in Metadata v12 from each broker."""
    ids = set()
    for address in t.bootstrap.split(","):
        r = raw(address, MetadataRequest(topics=[MetadataRequestTopic(name=topic)],
                                         allow_auto_topic_creation=False), 12)
        ids.add(r.topics[0].topic_id)
    return ids


def _until_all_brokers_agree(t: Target, topic: str) -> set[object]:
    deadline = time.monotonic() + 30
    while len(ids := _ids_by_broker(t, topic)) != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    return ids


def test_a_topic_gets_an_id_and_a_recreated_topic_a_new_one(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "with-id", 3, 3)
        first = _until_all_brokers_agree(t, "with-id")
        admin = t.admin()
        described = outcome(admin.describe_topics(TopicCollection(["with-id"]))["with-id"])
        assert outcome(admin.delete_topics(["with-id"], operation_timeout=30)["with-id"]) is None
        deadline = time.monotonic() + 30
        while topic_shape(t, "with-id", timeout_s=0) != "UNKNOWN_TOPIC_OR_PART":
            assert time.monotonic() < deadline, "the topic was not deleted in time"
            time.sleep(0.2)
        # The name is free once the controller has finished the deletion, a little after the
        # topic left Metadata: until then creating it again is TOPIC_ALREADY_EXISTS.
        while (created := create_topic(t, "with-id", 1, 3)) == "TOPIC_ALREADY_EXISTS":
            assert time.monotonic() < deadline, "the topic could not be created again in time"
            time.sleep(0.2)
        assert created is None, created
        assert topic_shape(t, "with-id")[0] == 1
        second = _until_all_brokers_agree(t, "with-id")
        (one,), (two,) = first, second
        return {
            "one id on every broker": (len(first), len(second)),
            "not the zero uuid": (one != ZERO_UUID, two != ZERO_UUID),
            "DescribeTopics shows the Metadata id": _bits(described.topic_id) == _signed_halves(one),
            "recreated topic has a new id": one != two,
        }

    assert pair.same(scenario) == {
        "one id on every broker": (1, 1),
        "not the zero uuid": (True, True),
        "DescribeTopics shows the Metadata id": True,
        "recreated topic has a new id": True,
    }


def _bits(client_uuid: Any) -> tuple[int, int]:
    """confluent-kafka's Uuid as its two signed 64-bit halves (its str() is standard base64,
    where Kafka writes URL-safe base64: compare the bits)."""
    return client_uuid.get_most_significant_bits(), client_uuid.get_least_significant_bits()


def _signed_halves(topic_id: object) -> tuple[int, int]:
    assert isinstance(topic_id, uuid.UUID)
    def signed(v: int) -> int:
        return v - (1 << 64) if v >= 1 << 63 else v
    return signed(topic_id.int >> 64), signed(topic_id.int & ((1 << 64) - 1))


@pytest.mark.parametrize("version", [8, 10, 12])
def test_authorized_operations_without_an_authorizer(pair: Pair, version: int) -> None:
    """Metadata asked for authorized operations: Kafka without an authorizer answers every
    operation a topic (and, at v8-10, the cluster) supports, for known and unknown topics."""
    topic = f"auth-ops-{version}"

    def scenario(t: Target) -> object:
        create_ready(t, topic, 1, 1)
        address = t.bootstrap.split(",")[0]
        seen = []
        for asked in (False, True):
            r = raw(address, MetadataRequest(
                topics=[MetadataRequestTopic(name=topic), MetadataRequestTopic(name="no-such")],
                allow_auto_topic_creation=False, include_cluster_authorized_operations=asked,
                include_topic_authorized_operations=asked), version)
            seen.append((r.cluster_authorized_operations,
                         [(x.name, x.error_code, x.topic_authorized_operations) for x in r.topics]))
        return seen

    pair.same(scenario)
