"""Topic administration in ZooKeeper: Kafka's `AdminUtils` replica assignment and
`AdminZkClient` topic creation / deletion marking.

The broker's CreateTopics / DeleteTopics handlers, auto topic creation on Metadata and the
`tidelog topics` tool all go through `AdminZkClient`; the controller notices the new assignment
(its watch on /brokers/topics) and elects the initial leaders. Creation only writes
`/config/topics/<t>` and `/brokers/topics/<t>`; deletion only creates
`/admin/delete_topics/<t>`: the rest is the controller's job, as in Kafka.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from tidelog.controller import zk_data
from tidelog.controller.zk_client import KafkaZkClient, TopicExistsError
from tidelog.protocol.errors import ErrorCode
from tidelog.storage.log_config import LogConfig

__all__ = [
    "AdminError",
    "AdminZkClient",
    "assign_replicas_to_brokers",
    "validate_topic_name",
]

# Kafka's Topic.MAX_NAME_LENGTH and legal characters.
MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")


class AdminError(ValueError):
    """A refused admin request, with the Kafka error code to answer it with."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


def validate_topic_name(topic: str) -> None:
    """Kafka's `Topic.validate`: raises AdminError(INVALID_TOPIC_EXCEPTION) when illegal."""
    if not topic:
        raise AdminError(ErrorCode.INVALID_TOPIC_EXCEPTION, "Topic name is illegal, it can't be empty")
    if topic in (".", ".."):
        raise AdminError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                         "Topic name cannot be \".\" or \"..\"")
    if len(topic) > MAX_TOPIC_NAME_LENGTH:
        raise AdminError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters,"
            f" topic name: {topic}",
        )
    if not _LEGAL_TOPIC.match(topic):
        raise AdminError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"Topic name \"{topic}\" is illegal, it contains a character other than ASCII"
            " alphanumerics, '.', '_' and '-'",
        )


def assign_replicas_to_brokers(
    broker_ids: Sequence[int],
    n_partitions: int,
    replication_factor: int,
    fixed_start_index: int = -1,
    start_partition_id: int = -1,
    rng: random.Random | None = None,
) -> dict[int, list[int]]:
    """Kafka's rack-unaware `AdminUtils.assignReplicasToBrokers`.

    The first replica of partition p goes to broker `(p + start_index) % n` of the sorted
    broker list; the others follow at a shift that grows by one every n partitions, so that
    leaders and followers are both spread round-robin. Without a `fixed_start_index` the
    start index and the first shift are random, as in Kafka.
    """
    if n_partitions <= 0:
        raise AdminError(ErrorCode.INVALID_PARTITIONS, "Number of partitions must be larger than 0.")
    if replication_factor <= 0:
        raise AdminError(ErrorCode.INVALID_REPLICATION_FACTOR,
                         "Replication factor must be larger than 0.")
    brokers = sorted(broker_ids)
    n = len(brokers)
    if replication_factor > n:
        raise AdminError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"Replication factor: {replication_factor} larger than available brokers: {n}.",
        )
    rand = rng or random.Random()
    start_index = fixed_start_index if fixed_start_index >= 0 else rand.randrange(n)
    next_replica_shift = fixed_start_index if fixed_start_index >= 0 else rand.randrange(n)
    current = max(0, start_partition_id)
    out: dict[int, list[int]] = {}
    for _ in range(n_partitions):
        if current > 0 and current % n == 0:
            next_replica_shift += 1
        first = (current + start_index) % n
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            replicas.append(brokers[_replica_index(first, next_replica_shift, j, n)])
        out[current] = replicas
        current += 1
    return out


def _replica_index(first_replica_index: int, second_replica_shift: int, replica_index: int,
                   n_brokers: int) -> int:
    shift = 1 + (second_replica_shift + replica_index) % (n_brokers - 1)
    return (first_replica_index + shift) % n_brokers


def validate_replica_assignment(
    assignment: Mapping[int, Sequence[int]], live_broker_ids: Sequence[int]
) -> None:
    """An explicit assignment: partitions 0..n-1, no duplicate replicas, one replication
    factor, every replica a known broker (Kafka's `validateReplicaAssignment`)."""
    if not assignment:
        raise AdminError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "Replica assignment is empty")
    if sorted(assignment) != list(range(len(assignment))):
        raise AdminError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                         "Partitions should be consecutive and start from 0")
    sizes = {len(r) for r in assignment.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise AdminError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                         "All partitions should have the same number of replicas")
    known = set(live_broker_ids)
    for p, replicas in sorted(assignment.items()):
        if len(set(replicas)) != len(replicas):
            raise AdminError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             f"Duplicate replica assignment found for partition {p}: {replicas}")
        unknown = sorted(set(replicas) - known)
        if unknown:
            raise AdminError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             f"Unknown broker(s) {unknown} in replica assignment of partition {p}")


def validate_topic_config(config: Mapping[str, Any]) -> dict[str, str]:
    """Topic-level overrides as strings; an unknown key or bad value -> INVALID_CONFIG."""
    strs = {str(k): str(v) for k, v in config.items()}
    try:
        LogConfig.from_dict(strs)
    except ValueError as e:
        raise AdminError(ErrorCode.INVALID_CONFIG, str(e)) from None
    return strs


class AdminZkClient:
    """Topic creation and deletion requests written to ZooKeeper (Kafka's `AdminZkClient`)."""

    def __init__(self, zk_client: KafkaZkClient, rng: random.Random | None = None) -> None:
        self.zk_client = zk_client
        self._rng = rng

    def assign(self, n_partitions: int, replication_factor: int) -> dict[int, list[int]]:
        """A round-robin assignment over the brokers registered right now."""
        return assign_replicas_to_brokers(
            self.zk_client.get_all_broker_ids(), n_partitions, replication_factor, rng=self._rng
        )

    def create_topic(
        self,
        topic: str,
        partitions: int,
        replication_factor: int,
        config: Mapping[str, Any] | None = None,
        replica_assignment: Mapping[int, Sequence[int]] | None = None,
        validate_only: bool = False,
    ) -> dict[int, list[int]]:
        """Validate, assign (unless an explicit assignment is given) and write the topic.

        Returns the assignment. Raises `AdminError` with the Kafka error code for every refusal
        (TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR,
        INVALID_REPLICA_ASSIGNMENT, INVALID_CONFIG, INVALID_TOPIC_EXCEPTION).
        """
        validate_topic_name(topic)
        overrides = validate_topic_config(config or {})
        if replica_assignment:
            assignment = {int(p): [int(b) for b in r] for p, r in replica_assignment.items()}
            validate_replica_assignment(assignment, self.zk_client.get_all_broker_ids())
        else:
            assignment = self.assign(partitions, replication_factor)
        if self.zk_client.topic_exists(topic):
            raise AdminError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{topic}' already exists.")
        # Kafka refuses names that collide once '.' and '_' are treated alike (metric names).
        collides = _collision_key(topic)
        for existing in self.zk_client.get_all_topics():
            if existing != topic and _collision_key(existing) == collides:
                raise AdminError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    f"Topic '{topic}' collides with existing topic: {existing}",
                )
        if validate_only:
            return assignment
        try:
            self.zk_client.create_topic(topic, assignment, overrides, topic_id=new_topic_id())
        except TopicExistsError:
            raise AdminError(ErrorCode.TOPIC_ALREADY_EXISTS,
                             f"Topic '{topic}' already exists.") from None
        return assignment

    def create_partitions(
        self,
        topic: str,
        count: int,
        assignments: Sequence[Sequence[int]] | None = None,
        validate_only: bool = False,
    ) -> dict[int, list[int]]:
        """Kafka's `ZkAdminManager.createPartitions` for one topic: grow it to `count`
        partitions, the new ones assigned round-robin from partition 0's first replica (or as
        `assignments` says, one list per new partition). The whole assignment is written back to
        /brokers/topics/<t> with the topic's id; the controller's watch on that znode creates
        the new partitions. Returns the new partitions' assignment.

        Refusals (nothing written): UNKNOWN_TOPIC_OR_PARTITION, INVALID_PARTITIONS for a count
        not above today's, INVALID_REPLICA_ASSIGNMENT, BROKER_NOT_AVAILABLE for an assignment
        naming a broker that is not registered (Kafka's messages)."""
        znode = self.zk_client.get_topic_znode(topic)
        if not znode or not znode[0]:
            raise AdminError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                             f"The topic '{topic}' does not exist.")
        existing, topic_id = znode
        if any(self.zk_client.get_topic_reassignments(topic)):
            # Kafka refuses it: the write would race the controller's reassignment (and drop
            # the adding/removing replicas the move resumes from).
            raise AdminError(ErrorCode.REASSIGNMENT_IN_PROGRESS,
                             f"A partition reassignment is in progress for the topic '{topic}'.")
        old = len(existing)
        if count < old:
            raise AdminError(
                ErrorCode.INVALID_PARTITIONS,
                f"Topic currently has {old} partitions, which is higher than the requested"
                f" {count}.")
        if count == old:
            raise AdminError(ErrorCode.INVALID_PARTITIONS, f"Topic already has {old} partitions.")
        brokers = sorted(self.zk_client.get_all_broker_ids())
        increment = count - old
        partition0 = existing.get(0)
        if not partition0:
            raise AdminError(ErrorCode.UNKNOWN_SERVER_ERROR,
                             f"Unexpected existing replica assignment for topic '{topic}',"
                             f" partition id 0 is missing. Assignment: {existing}")
        if assignments is not None:
            proposed = [[int(b) for b in r] for r in assignments]
            unknown = sorted({b for r in proposed for b in r} - set(brokers))
            if unknown:
                raise AdminError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"Unknown broker(s) in replica assignment: {', '.join(map(str, unknown))}.")
            if len(proposed) != increment:
                raise AdminError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"Increasing the number of partitions by {increment} but {len(proposed)}"
                    " assignments provided.")
            new = {old + i: r for i, r in enumerate(proposed)}
            rf = len(partition0)
            for p, replicas in new.items():
                if not replicas:
                    raise AdminError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                     f"Cannot have replication factor of 0 for partition id {p}.")
                if len(set(replicas)) != len(replicas):
                    raise AdminError(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        "Duplicate brokers not allowed in replica assignment: "
                        f"{', '.join(map(str, replicas))} for partition id {p}.")
            bad = sorted((p, len(r)) for p, r in new.items() if len(r) != rf)
            if bad:
                raise AdminError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    "Inconsistent replication factor between partitions, partition 0 has"
                    f" {rf} while partitions [{', '.join(str(p) for p, _ in bad)}] have"
                    f" replication factors [{', '.join(str(n) for _, n in bad)}], respectively.")
        else:
            # Kafka continues the round-robin from partition 0's first replica.
            start = next((i for i, b in enumerate(brokers) if b >= partition0[0]), 0)
            new = assign_replicas_to_brokers(brokers, increment, len(partition0),
                                             fixed_start_index=start, start_partition_id=old)
        if not validate_only:
            self.zk_client.set_topic_assignment(topic, {**existing, **new}, topic_id=topic_id)
        return new

    def delete_topic(self, topic: str) -> None:
        """Mark the topic for deletion; the controller deletes it."""
        if not self.zk_client.topic_exists(topic):
            raise AdminError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                             f"Topic {topic} does not exist")
        self.zk_client.create_delete_topic_path(topic)


def new_topic_id() -> UUID:
    """Kafka's `Uuid.randomUuid`: a random (version 4) UUID, never the zero id nor the metadata
    topic's reserved id (1), nor one whose string form starts with '-' (a command-line flag)."""
    while True:
        topic_id = uuid.uuid4()
        if topic_id.int > 1 and not zk_data.topic_id_to_string(topic_id).startswith("-"):
            return topic_id


def _collision_key(topic: str) -> str:
    return topic.replace(".", "_")
