"""The idempotent producer's invariants, checked at the end of a run on every replica's log.

- NoDuplicates: no batch is in a log twice (a retried batch answered as a duplicate is never
  written again: the batch's CRC32C covers its producer id, epoch, sequence and unique value).
- InOrderSequences: per producer id, in offset order, epochs never go back, a batch continues
  the sequence of the previous one of the same epoch, and a new epoch starts at sequence 0 (the
  leader refuses anything else; a gap or a repeat means it lost or misread its producer state).
- NoDuplicateAck: no producer saw one batch acknowledged at two different offsets.

The first batch of a producer in a log may carry any sequence: the log may start after the
producer's earlier batches (retention, or a follower that restarted its log at the leader's
start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tidelog.replication.types import TopicPartition
from tidelog.sim.invariants import Violation

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.sim.cluster import SimCluster

__all__ = ["check_log", "check_producers"]

_SEQUENCE_WRAP = 2**31
_MAX_PER_LOG = 3  # a broken log tends to repeat: report its first few breaks


def check_log(now_ms: int, tp: TopicPartition, broker_id: int, log: Any) -> list[Violation]:
    out: list[Violation] = []

    def fail(name: str, detail: str) -> None:
        if len(out) < _MAX_PER_LOG:
            out.append(Violation(now_ms, name, tp, f"broker {broker_id}: {detail}"))

    offset_of_crc: dict[int, int] = {}
    last: dict[int, tuple[int, int, int]] = {}  # producer id -> (epoch, last sequence, offset)
    for b in log.batches(log.log_start_offset):
        pid = b.producer_id
        if pid < 0 or b.is_control_batch:
            continue
        offset = b.base_offset
        first = offset_of_crc.setdefault(b.crc, offset)
        if first != offset:
            fail("NoDuplicates", f"the batch at offset {offset} is the one at offset {first} "
                 f"again (producer {pid}, epoch {b.producer_epoch}, sequence {b.base_sequence})")
        epoch, seq = b.producer_epoch, b.base_sequence
        prev = last.get(pid)
        if prev is not None:
            prev_epoch, prev_seq, prev_offset = prev
            if epoch < prev_epoch:
                fail("InOrderSequences", f"producer {pid} epoch {epoch} at offset {offset} "
                     f"after epoch {prev_epoch} at offset {prev_offset}")
            elif epoch == prev_epoch and seq != (prev_seq + 1) % _SEQUENCE_WRAP:
                fail("InOrderSequences", f"producer {pid} epoch {epoch}: sequence {seq} at "
                     f"offset {offset} after {prev_seq} at offset {prev_offset}")
            elif epoch > prev_epoch and seq != 0:
                fail("InOrderSequences", f"producer {pid} starts epoch {epoch} at sequence "
                     f"{seq} (offset {offset})")
        last[pid] = (epoch, b.last_sequence, offset)
    return out


def check_producers(cluster: SimCluster) -> list[Violation]:
    """Every running replica's log of every partition, and every producer's acknowledgements."""
    now = cluster.scheduler.now_ms
    out: list[Violation] = []
    for prod in cluster.producers:
        for crc, first, second in prod.double_acks[:_MAX_PER_LOG]:
            out.append(Violation(now, "NoDuplicateAck", prod.tp, f"producer {prod.node_id}: "
                                 f"batch {crc:#x} acknowledged at {first} and at {second}"))
    for tp in cluster.tps:
        for node in cluster.nodes:
            if not node.running or node.disk_failed:
                continue
            log = node.log(tp)
            if log is not None:
                out.extend(check_log(now, tp, node.broker_id, log))
    return out
