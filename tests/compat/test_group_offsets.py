"""OffsetCommit and OffsetFetch at the group coordinator, as Kafka answers them: commits of a
group without members (generation -1, as admin tools and assign()-only consumers send), each
per-partition error, and commits naming a generation of a group that does not exist."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from differential import Pair, Target, coordinator, create_ready, raw

from tidelog.protocol.errors import ErrorCode
from tidelog.protocol.messages import offset_commit as oc
from tidelog.protocol.messages import offset_fetch as of

pytestmark = [pytest.mark.integration, pytest.mark.slow]


# A coordinator just elected, or still loading the group's partition, sends the client back to
# FindCoordinator: clients retry, so do the tests (bounded).
_RETRY = {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
          ErrorCode.COORDINATOR_NOT_AVAILABLE}


def _at_coordinator(t: Target, group: str, request: object, version: int,
                    errors: Callable[[Any], list[int]]) -> Any:
    deadline = time.monotonic() + 30
    while True:
        r = raw(coordinator(t, group), request, version)
        if not _RETRY & set(errors(r)) or time.monotonic() >= deadline:
            return r
        time.sleep(0.3)


def commit(t: Target, group: str, offsets: dict[tuple[str, int], int], generation: int = -1,
           member: str = "") -> dict[tuple[str, int], str]:
    request = oc.OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=generation, member_id=member,
        topics=[oc.OffsetCommitRequestTopic(topic, [oc.OffsetCommitRequestPartition(p, o)])
                for (topic, p), o in offsets.items()])
    r = _at_coordinator(t, group, request, 8, lambda r: [p.error_code for tp in r.topics
                                                         for p in tp.partitions])
    return {(tp.name, p.partition_index): ErrorCode(p.error_code).name
            for tp in r.topics for p in tp.partitions}


def fetch(t: Target, group: str, partitions: list[tuple[str, int]]) -> object:
    request = of.OffsetFetchRequest(group_id=group, topics=[
        of.OffsetFetchRequestTopic(topic, [p]) for topic, p in partitions])
    r = _at_coordinator(t, group, request, 7, lambda r: [r.error_code])
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


def test_a_committed_offset_of_zero_is_kept(pair: Pair) -> None:
    """A consumer closing with nothing read from a partition commits its position, 0."""
    def scenario(t: Target) -> object:
        create_ready(t, "zero-commit", 2, 3)
        committed = commit(t, "g-zero", {("zero-commit", 0): 0, ("zero-commit", 1): 4})
        return committed, fetch(t, "g-zero", [("zero-commit", 0), ("zero-commit", 1)])

    pair.same(scenario)
