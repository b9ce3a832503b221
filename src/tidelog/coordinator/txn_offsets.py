"""Offsets committed inside transactions (KIP-98 / KIP-447): TxnOffsetCommit writes them to
the group's offsets partition in a transactional batch of the producer, and they become the
group's committed offsets only when the COMMIT marker lands on that partition (an ABORT drops
them). Kafka keeps them in `GroupMetadata.pendingTransactionalOffsetCommits` and completes them
in `GroupMetadataManager.handleTxnCompletion`."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tidelog.coordinator.offsets import OffsetAndMetadata

__all__ = ["PendingTxnOffsets"]

Partition = tuple[str, int]


class PendingTxnOffsets:
    def __init__(self) -> None:
        # group -> producer id -> (topic, partition) -> offset
        self.by_group: dict[str, dict[int, dict[Partition, OffsetAndMetadata]]] = {}

    def add(self, group_id: str, producer_id: int,
            offsets: Mapping[Partition, OffsetAndMetadata]) -> None:
        self.by_group.setdefault(group_id, {}).setdefault(producer_id, {}).update(offsets)

    def complete(self, producer_id: int, in_scope: Callable[[str], bool], commit: bool
                 ) -> dict[str, dict[Partition, OffsetAndMetadata]]:
        """The transaction of `producer_id` ended for the groups `in_scope` says the marker's
        partition holds: its offsets, by group, to make visible (none when aborted)."""
        out: dict[str, dict[Partition, OffsetAndMetadata]] = {}
        for group_id in [g for g in self.by_group if in_scope(g)]:
            per_producer = self.by_group[group_id]
            offsets = per_producer.pop(producer_id, None)
            if not per_producer:
                del self.by_group[group_id]
            if offsets and commit:
                out[group_id] = offsets
        return out

    def drop_groups(self, which: Callable[[str], bool]) -> None:
        for group_id in [g for g in self.by_group if which(g)]:
            del self.by_group[group_id]

    def has_pending(self, group_id: str, partition: Partition | None = None) -> bool:
        """Whether an open transaction holds an offset of the group (of `partition`, if
        given): OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT then."""
        per_producer = self.by_group.get(group_id)
        if not per_producer:
            return False
        return partition is None or any(partition in o for o in per_producer.values())
