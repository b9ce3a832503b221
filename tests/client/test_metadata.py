"""ClusterMetadata: merging Metadata answers (a partial answer keeps other topics)."""

from __future__ import annotations

from kafka_peer import metadata_answer

from tidelog.client.metadata import ClusterMetadata, TopicPartition
from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages.metadata import MetadataResponseTopic


def test_answers_merge_and_an_all_topics_answer_replaces_the_topic_list() -> None:
    meta = ClusterMetadata()
    meta.update(
        metadata_answer({1: 9001, 2: 9002}, {("a", 0): 1, ("a", 1): 2}, controller_id=2),
        all_topics=True,
    )
    assert sorted(meta.brokers) == [1, 2] and meta.controller_id == 2
    assert meta.leader_for(TopicPartition("a", 1)) == 2
    assert meta.partitions_for("a") == [0, 1]
    # a partial answer (one topic asked) adds to what is known
    meta.update(metadata_answer({1: 9001}, {("b", 0): 1}), all_topics=False)
    assert sorted(meta.topics) == ["a", "b"]
    assert sorted(meta.brokers) == [1]  # the broker list is always the latest answer's
    # an answer for every topic drops the topics it does not list (deleted)
    meta.update(metadata_answer({1: 9001}, {("b", 0): 1}), all_topics=True)
    assert sorted(meta.topics) == ["b"]
    assert meta.leader_for(TopicPartition("a", 0)) is None
    assert meta.partitions_for("a") is None


def test_leaderless_partitions_and_topic_errors() -> None:
    meta = ClusterMetadata()
    answer = metadata_answer({1: 9001}, {("a", 0): -1})
    answer.topics.append(
        MetadataResponseTopic(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name="gone")
    )
    meta.update(answer, all_topics=False)
    assert meta.leader_for(TopicPartition("a", 0)) is None
    assert meta.partition(TopicPartition("a", 0)) is not None
    assert meta.partitions_for("gone") is None
    assert meta.topics["gone"].error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert str(TopicPartition("a", 3)) == "a-3"
