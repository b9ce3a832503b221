"""`tidelog topics describe` rows: each replica's own LEO and HW (issue 11 item 5)."""

from __future__ import annotations

from types import SimpleNamespace

from tidelog.cli.topics_cmd import PartitionDescription, ReplicaOffsets, format_description


def test_each_replica_row_shows_its_own_high_watermark() -> None:
    meta = {"t": SimpleNamespace(error=None, partitions={0: SimpleNamespace(replicas=[1, 2, 3])})}
    d = PartitionDescription("t", 0, leader=1, leader_epoch=4, replicas=(1, 2, 3), isr=(1, 2),
                             high_watermark=9, offsets=[
                                 ReplicaOffsets(1, 12, None, 9),
                                 ReplicaOffsets(2, 12, None, 7),  # learns HW 9 on its next fetch
                                 ReplicaOffsets(3, None, "unreachable: refused"),
                             ])
    lines = format_description(meta, [d]).splitlines()
    assert "\tHW: 9" in lines[1]  # the partition's HW: the leader's
    assert lines[2] == "\t\tReplica: 1\t(leader)\tLEO: 12\tHW: 9\tLag: 0"
    assert lines[3] == "\t\tReplica: 2\t(in-sync)\tLEO: 12\tHW: 7\tLag: 0"
    assert lines[4] == "\t\tReplica: 3\t(out-of-sync)\tLEO: ?\tHW: ?\tLag: ?\tunreachable: refused"
