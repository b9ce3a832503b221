"""check_replicas: the end-of-run replica invariants the simulator and the real-process fault
tests share, over any ClusterView."""

from __future__ import annotations

from dataclasses import dataclass, field

from tidelog.replication.types import TopicPartition
from tidelog.sim.invariants import BatchSig, check_replicas

TP = TopicPartition("t", 0)
A: BatchSig = (0, 4, 0, 111)
B: BatchSig = (5, 9, 0, 222)
B_OTHER: BatchSig = (5, 9, 1, 333)  # same offsets, written in another leader epoch


@dataclass
class State:
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]


@dataclass
class Replica:
    sigs: list[BatchSig]

    @property
    def log_end_offset(self) -> int:
        return self.sigs[-1][1] + 1 if self.sigs else 0

    def batches(self, start: int = 0, end: int | None = None) -> list[BatchSig]:
        return [s for s in self.sigs if s[1] >= start and (end is None or s[0] < end)]


@dataclass
class View:
    logs: dict[int, list[BatchSig]]
    state: State = field(default_factory=lambda: State(1, 0, (1, 2, 3)))
    hw: int = 10
    down: set[int] = field(default_factory=set)

    def partitions(self) -> list[TopicPartition]:
        return [TP]

    def assigned_replicas(self, tp: TopicPartition) -> list[int]:
        return [1, 2, 3]

    def zk_state(self, tp: TopicPartition) -> State:
        return self.state

    def leader_high_watermark(self, tp: TopicPartition) -> int:
        return self.hw

    def running(self, broker_id: int) -> bool:
        return broker_id not in self.down

    def replica(self, broker_id: int, tp: TopicPartition) -> Replica | None:
        sigs = self.logs.get(broker_id)
        return None if sigs is None else Replica(sigs)


def names(view: View, converged: bool = True) -> list[str]:
    return [name for name, _, _ in check_replicas(view, converged)]


def test_identical_replicas_pass() -> None:
    assert names(View({1: [A, B], 2: [A, B], 3: [A, B]})) == []


def test_a_member_with_other_batches_below_the_hw_breaks_strong_isr() -> None:
    assert names(View({1: [A, B], 2: [A, B_OTHER], 3: [A, B]})) == ["StrongIsr", "Converged"]


def test_a_member_short_of_the_hw_breaks_valid_high_watermark() -> None:
    assert names(View({1: [A, B], 2: [A], 3: [A, B]}), converged=False) == ["ValidHighWatermark"]


def test_above_the_hw_only_convergence_is_asked() -> None:
    view = View({1: [A, B], 2: [A, B_OTHER], 3: [A, B]}, hw=5)
    assert names(view, converged=False) == []
    assert names(view) == ["Converged"]


def test_a_leader_outside_its_isr_and_a_replica_without_a_log() -> None:
    view = View({1: [A], 2: [A]}, state=State(1, 0, (2, 3)), hw=5)
    assert names(view) == ["LeaderInIsr", "ValidHighWatermark", "Converged"]


def test_a_leader_whose_log_ends_below_its_hw_is_caught() -> None:
    # (a view reading the wrong files would see empty logs and find nothing else)
    assert names(View({1: [], 2: [], 3: []})) == ["ValidHighWatermark"]


def test_stopped_brokers_and_exempt_members_are_not_judged() -> None:
    view = View({1: [A, B], 2: [A], 3: []}, down={3})
    assert names(view) == ["ValidHighWatermark", "Converged"]
    found = check_replicas(view, True, exempt=lambda b, tp, epoch: b == 2)
    assert [n for n, _, _ in found] == ["Converged"]
