"""The partition-lifecycle invariants (reassignment, KIP-455), checked after every simulated
event and when the controller sends StopReplica(delete=true):

- IsrWithinAssigned: the ISR in ZooKeeper is within the partition's assigned replicas as the
  topic znode holds them (RS = ORS + TRS while it moves, AR otherwise).
- SuccessorsInIsr: when a move completes (the topic znode's assignment settles on TRS with no
  adding/removing replicas left), every replica of the new assignment is in the ISR.
- RemovedReplicaDeletedEarly: StopReplica(delete=true) goes only to a replica that is not
  assigned any more and, if it held the settled assignment's data (an original replica), only
  after the move completed — so a removed replica's log is deleted only once its successors
  are in the ISR. (A replica added by a move that was then cancelled may be deleted at once,
  as Kafka's controller does; a replaced move keeps it until the new target is in the ISR.)

NoAckedLoss, MonotonicHighWatermark and OneLeaderPerEpoch are the general checks
(sim/invariants.py, `SimCluster.final_checks`), which run through every move as well. A replica
deleted by a move is exempt from ValidHighWatermark/StrongIsr for leaders of epochs older than
its removal from the ISR (`deleted_for`): a frozen leader may still count the ISR it had then,
as it may after a power loss (a fetch of the new replica is fenced by the newer epoch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidelog.controller import zk_data
from tidelog.replication.types import TopicPartition

if TYPE_CHECKING:  # pragma: no cover
    from tidelog.sim.cluster import SimCluster


class LifecycleChecker:
    def __init__(self, cluster: SimCluster,
                 fail: Callable[[str, TopicPartition | None, str], None]) -> None:
        self.cluster = cluster
        self.fail = fail
        # Each partition's settled assignment (the replicas holding its data as full members).
        self.settled: dict[TopicPartition, frozenset[int]] = {}
        self._seen: dict[TopicPartition, tuple[Any, Any]] = {}
        self._paths: dict[TopicPartition, str] = {}
        self._zxid = -1
        # (broker, partition) -> the leader epoch of the state in which the controller had
        # taken the replica out of the ISR when it sent StopReplica(delete=true).
        self.deleted_in: dict[tuple[int, TopicPartition], int] = {}
        self.enabled = True

    def deleted_for(self, broker: int, tp: TopicPartition, leader_epoch: int) -> bool:
        """True if `broker`'s replica of `tp` was deleted by a move that a leader of
        `leader_epoch` (older than the removal) cannot know of."""
        removed_in = self.deleted_in.get((broker, tp))
        return removed_in is not None and leader_epoch < removed_in

    def check(self) -> None:
        c = self.cluster
        zxid = c.zk.zxid
        if zxid == self._zxid or not self.enabled:
            return  # no znode changed since the last look (most events)
        self._zxid = zxid
        c.sync_topic()
        topic_stat = c._topic_stat
        nodes = c.zk.nodes
        for tp in c.tps:
            path = self._paths.get(tp)
            if path is None:
                path = self._paths[tp] = zk_data.partition_state_path(tp)
            node = nodes.get(path)
            key = (topic_stat, None if node is None else node.stat)
            if self._seen.get(tp) != key:
                self._seen[tp] = key
                self._check_partition(tp)

    def _check_partition(self, tp: TopicPartition) -> None:
        c = self.cluster
        assigned = c.assignments.get(tp, ())
        s = c.zk_state(tp)
        isr = set(s.isr) if s is not None else set()
        if not isr <= set(assigned):
            self.fail("IsrWithinAssigned", tp, f"ISR {sorted(isr)} not within the assigned "
                      f"replicas {list(assigned)}")
        if tp in c.moving:
            return
        now = frozenset(assigned)
        before = self.settled.get(tp)
        if before is not None and before - now and not now <= isr:
            self.fail("SuccessorsInIsr", tp, f"replicas {sorted(before - now)} removed with "
                      f"ISR {sorted(isr)} lacking the new replicas {sorted(now - isr)}")
        self.settled[tp] = now

    def on_delete_sent(self, broker: int, tp: TopicPartition) -> None:
        """The controller sends `broker` StopReplica(delete=true) for `tp` now."""
        c = self.cluster
        s = c.zk_state(tp)
        if s is not None:
            self.deleted_in[(broker, tp)] = s.leader_epoch
        if not self.enabled:
            return
        self.check()  # the settled assignment as of now
        assigned = c.assignments.get(tp, ())
        if broker in assigned:
            self.fail("RemovedReplicaDeletedEarly", tp, f"StopReplica(delete) to {broker}, "
                      f"still assigned {list(assigned)}")
        elif broker in self.settled.get(tp, ()):
            self.fail("RemovedReplicaDeletedEarly", tp, f"StopReplica(delete) to {broker} "
                      "before its successors were in the ISR (the move is not complete)")
