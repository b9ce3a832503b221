"""OffsetCommit and OffsetFetch at the group coordinator, as Kafka answers them: commits of a
group without members (generation -1, as admin tools and assign()-only consumers send), each
per-partition error, and commits naming a generation of a group that does not exist."""

from __future__ import annotations

import pytest
from differential import Pair, Target, coordinator, create_ready, raw

from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import offset_commit as oc
from tidelog.protocol.messages import offset_fetch as of

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def commit(t: Target, group: str, offsets: dict[tuple[str, int], int], generation: int = -1,
           member: str = "") -> dict[tuple[str, int], str]:
    request = oc.OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=generation, member_id=member,
        topics=[oc.OffsetCommitRequestTopic(topic, [oc.OffsetCommitRequestPartition(p, o)])
                for (topic, p), o in offsets.items()])
    r = raw(coordinator(t, group), request, 8)
    return {(tp.name, p.partition_index): ErrorCode(p.error_code).name
            for tp in r.topics for p in tp.partitions}


def fetch(t: Target, group: str, partitions: list[tuple[str, int]]) -> object:
    request = of.OffsetFetchRequest(group_id=group, topics=[
        of.OffsetFetchRequestTopic(topic, [p]) for topic, p in partitions])
    r = raw(coordinator(t, group), request, 7)
    return (ErrorCode(r.error_code).name,
            {(tp.name, p.partition_index): (p.committed_offset, ErrorCode(p.error_code).name)
             for tp in r.topics for p in tp.partitions})


def test_commit_and_fetch_without_members_and_each_partition_error(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "committed", 2, 3)
        committed = commit(t, "g-simple", {("committed", 0): 5, ("committed", 1): 7,
                                           ("committed", 9): 1, ("no-such-topic", 0): 1})
        fetched = fetch(t, "g-simple", [("committed", 0), ("committed", 1), ("committed", 9),
                                        ("no-such-topic", 0)])
        never = fetch(t, "g-never", [("committed", 0)])
        return committed, fetched, never

    pair.same(scenario)


def test_commit_with_a_generation_to_a_group_that_does_not_exist(pair: Pair) -> None:
    def scenario(t: Target) -> object:
        create_ready(t, "gen-commit", 1, 3)
        return (commit(t, "g-ghost", {("gen-commit", 0): 1}, generation=3, member="m-1"),
                fetch(t, "g-ghost", [("gen-commit", 0)]))

    pair.same(scenario)
