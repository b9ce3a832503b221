"""What the controller reads and writes for a broker's failed log dir, as Kafka's ZooKeeper
mode: the /log_dir_event_notification znodes, the LeaderAndIsr answer's partition errors, and
the UpdateMetadata naming replicas on failed dirs as offline."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from test_controller_channel import BROKERS, partitions_of, roundtrip, st

from tidelog.controller import core, zk_data
from tidelog.controller.channel_manager import (
    build_update_metadata,
    leader_and_isr_partition_errors,
)
from tidelog.controller.controller import KafkaController
from tidelog.controller.core import ControllerCore
from tidelog.controller.executor import DecisionExecutor
from tidelog.protocol.messages import leader_and_isr as lai
from tidelog.replication.types import TopicPartition


def test_the_notification_is_kafkas_znode() -> None:
    assert zk_data.log_dir_event_path("0000000003") == (
        "/log_dir_event_notification/log_dir_event_0000000003")
    data = zk_data.encode_log_dir_event_notification(4)
    assert data == b'{"version":1,"broker":4,"event":1}'
    assert zk_data.decode_log_dir_event_notification("/x", data) == 4
    assert zk_data.log_dir_event_sequence_number("log_dir_event_0000000012") == "0000000012"
    with pytest.raises(zk_data.ZkDataError):
        zk_data.decode_log_dir_event_notification("/x", b'{"version":1}')


def test_partition_errors_of_every_leader_and_isr_response_shape() -> None:
    old = lai.LeaderAndIsrResponse(partition_errors=[
        lai.LeaderAndIsrPartitionError("a", 0, 56), lai.LeaderAndIsrPartitionError("a", 1, 0)])
    assert leader_and_isr_partition_errors(old, {}) == {
        TopicPartition("a", 0): 56, TopicPartition("a", 1): 0}
    known, gone = uuid.uuid4(), uuid.uuid4()
    new = lai.LeaderAndIsrResponse(topics=[
        lai.LeaderAndIsrTopicError(known, [lai.LeaderAndIsrPartitionError("", 2, 56)]),
        lai.LeaderAndIsrTopicError(gone, [lai.LeaderAndIsrPartitionError("", 0, 56)])])
    assert leader_and_isr_partition_errors(new, {known: "b"}) == {TopicPartition("b", 2): 56}


@pytest.mark.parametrize("version", [4, 5, 6])
def test_update_metadata_names_replicas_on_failed_dirs_offline(version: int) -> None:
    req = core.UpdateMetadataRequest(
        1, 5, 77, (st("a", 0, 2, 3, (2, 3)), st("a", 1, 2, 3, (2, 3))), ((1, 70), (2, 71)),
        offline_dir_replicas=((TopicPartition("a", 0), (1,)),))
    parts = partitions_of(roundtrip(build_update_metadata(req, BROKERS, version), version))
    # broker 3 is dead; broker 1's replica of a-0 is on a failed dir
    assert parts[("a", 0)].offline_replicas == [1, 3]
    assert parts[("a", 1)].offline_replicas == [3]


class _IdsChangingMeanwhile(dict[str, uuid.UUID]):
    """The controller's topic ids while its ZooKeeper worker thread adds one: CPython fails
    an iteration over a dict that grows, so the event loop's side may only look ids up."""

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("dictionary changed size during iteration")

    def items(self) -> Any:
        raise RuntimeError("dictionary changed size during iteration")


def test_a_storage_error_answer_is_read_while_topic_ids_are_added() -> None:
    controller = KafkaController({}, None, 1)  # type: ignore[arg-type]
    topic_id = uuid.uuid4()
    controller.topic_ids = _IdsChangingMeanwhile(a=topic_id)
    core_ = ControllerCore(1, 5)
    core_.live_brokers[2] = 70
    controller.executor = DecisionExecutor(None, core_, None)  # type: ignore[arg-type]
    request = core.LeaderAndIsrRequest(1, 5, 70, (st("a", 0, 2, 3, (2,)),), (2,))
    response = lai.LeaderAndIsrResponse(topics=[
        lai.LeaderAndIsrTopicError(topic_id, [lai.LeaderAndIsrPartitionError("", 0, 56)])])

    async def main() -> int:
        controller._on_control_response(2, request, response)
        return controller._queue.qsize()

    assert asyncio.run(main()) == 1  # LeaderAndIsrResponseReceived, with the storage error
