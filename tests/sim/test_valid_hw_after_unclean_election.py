"""ValidHighWatermark after an unclean election: a leader of an older epoch that still acts (a
zombie) may have a HW above the LEO of a member of its ISR that has since followed the unclean
leader and truncated to its log (Kafka allows that state: the data loss unclean election gives
up); everywhere else the invariant stays strict."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import pytest

from tidelog.replication.types import TopicPartition
from tidelog.sim.invariants import InvariantChecker
from tidelog.sim.runner import UNCLEAN_ALLOWED, run_seed, unclean_config
from tidelog.sim.scenarios import ScenarioRun

TP = TopicPartition("t", 0)


@dataclass(frozen=True)
class State:
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]


@dataclass
class Follower:
    leader_epoch: int
    log_end_offset: int


@dataclass
class View:
    """One acting leader (broker 0: its epoch, HW and ISR as it believes them) and its
    followers as they are now."""

    leader_epoch: int
    hw: int
    isr: frozenset[int]
    followers: dict[int, Follower] = field(default_factory=dict)

    def acting_leaders(self) -> Iterator[tuple[int, TopicPartition, int, int, frozenset[int],
                                               None]]:
        yield 0, TP, self.leader_epoch, self.hw, self.isr, None

    def member_log_end_offset(self, broker_id: int, tp: TopicPartition) -> int | None:
        f = self.followers.get(broker_id)
        return None if f is None else f.log_end_offset

    def member_leader_epoch(self, broker_id: int, tp: TopicPartition) -> int | None:
        f = self.followers.get(broker_id)
        return None if f is None else f.leader_epoch

    def exempt(self, broker_id: int, tp: TopicPartition, leader_epoch: int) -> bool:
        return False

    def zk_state(self, tp: TopicPartition) -> None:
        return None  # StrongIsr compares only ZooKeeper's leader: not this test's subject


def checker(view: View) -> InvariantChecker:
    return InvariantChecker(view, now_ms=lambda: 0)  # type: ignore[arg-type]


def fired(c: InvariantChecker) -> list[str]:
    c.check()
    return [v.invariant for v in c.violations]


def elect_uncleanly(c: InvariantChecker) -> None:
    """Seed 95's history: 0 leads epochs 0 and 1 (ISR {0, 1} from epoch 1); 1 leads alone
    (epochs 2-3), goes down (epoch 4, offline); 2, outside the ISR, is elected in epoch 5, then
    again in 6 (one event)."""
    c.note_partition_write(TP, None, State(0, 0, (0, 1, 2)))
    c.note_partition_write(TP, State(0, 0, (0, 1, 2)), State(0, 1, (0, 1)))
    c.note_partition_write(TP, State(0, 1, (0, 1)), State(1, 2, (1,)))
    c.note_partition_write(TP, State(1, 2, (1,)), State(1, 3, (1,)))
    c.note_partition_write(TP, State(1, 3, (1,)), State(-1, 4, (1,)))
    c.note_partition_write(TP, State(-1, 4, (1,)), State(2, 5, (2,)))
    c.note_partition_write(TP, State(-1, 4, (1,)), State(2, 6, (2,)))


def test_a_zombie_leaders_hw_may_exceed_a_member_that_follows_the_unclean_leader() -> None:
    # Seed 95 at 3,807 ms: 0 (paused since 500 ms) still leads epoch 0 with HW 31 over its
    # ISR {0, 1}; 1 came back, follows 2 in epoch 7 and truncated to 2's log (LEO 0).
    c = checker(View(0, 31, frozenset({0, 1}), {1: Follower(7, 0)}))
    elect_uncleanly(c)
    assert c.unclean_epochs[TP] == [5]  # 6 re-elected 2 from the ISR {2} epoch 5 wrote
    assert fired(c) == []


def test_a_zombies_hw_may_rise_only_to_what_the_member_held_before_it_moved_on() -> None:
    # 1 held 40 under the zombie (epoch 1), whose HW was 31 (another member lagged); 1 then
    # follows the unclean leader (epoch 7) down to LEO 0.
    view = View(1, 31, frozenset({0, 1}), {1: Follower(1, 40)})
    c = checker(view)
    elect_uncleanly(c)
    assert fired(c) == []
    view.followers[1] = Follower(7, 0)
    assert fired(c) == []
    view.hw = 40  # 1's last fetch reported 40: the zombie may still count it
    assert fired(c) == []
    view.hw = 41  # above anything 1 ever held under it: not a state Kafka allows
    assert fired(c) == ["ValidHighWatermark"]


def test_a_zombies_hw_that_rises_after_a_member_came_back_into_the_unclean_history_fires() -> None:
    # 1 was never seen under the zombie (down, then back straight into epoch 7): the bound is
    # the zombie's HW when the exemption first applied.
    view = View(0, 31, frozenset({0, 1}), {1: Follower(7, 0)})
    c = checker(view)
    elect_uncleanly(c)
    assert fired(c) == []
    view.hw = 32
    assert fired(c) == ["ValidHighWatermark"]


def test_without_an_unclean_election_the_zombies_hw_is_still_checked() -> None:
    c = checker(View(1, 31, frozenset({0, 1}), {1: Follower(7, 0)}))
    c.note_partition_write(TP, None, State(0, 1, (0, 1)))
    c.note_partition_write(TP, State(0, 1, (0, 1)), State(1, 2, (1,)))  # from the ISR
    assert c.unclean_epochs == {}
    assert fired(c) == ["ValidHighWatermark"]


def test_a_member_still_in_an_epoch_before_the_unclean_election_is_checked() -> None:
    # 1 has not yet followed the unclean leader: nothing it holds can have been taken back.
    c = checker(View(1, 31, frozenset({0, 1}), {1: Follower(3, 20)}))
    elect_uncleanly(c)
    assert fired(c) == ["ValidHighWatermark"]


@pytest.mark.parametrize("leader_epoch", [5, 7])
def test_the_unclean_leader_and_later_ones_are_checked(leader_epoch: int) -> None:
    c = checker(View(leader_epoch, 31, frozenset({0, 1}), {1: Follower(7, 20)}))
    elect_uncleanly(c)
    assert fired(c) == ["ValidHighWatermark"]


def test_a_partition_created_again_forgets_the_old_unclean_elections() -> None:
    c = checker(View(1, 31, frozenset({0, 1}), {1: Follower(7, 0)}))
    elect_uncleanly(c)
    c.note_partition_write(TP, None, State(0, 0, (0, 1)))  # deleted, created again
    assert c.unclean_epochs == {}
    assert fired(c) == ["ValidHighWatermark"]


def test_scripted_a_paused_leader_outlives_an_unclean_election() -> None:
    # The random seeds' state, set up step by step (it does not hang on a seed's trajectory).
    cfg = replace(unclean_config(), brokers=3, replication_factor=3, assignments={0: (0, 1, 2)})
    sc = ScenarioRun("zombie_after_unclean", False, cfg)
    sc.boot()
    sc.stop(2, "clean")  # 2 leaves the ISR holding nothing
    assert sc.wait_gone(2) and sc.run_until(lambda: sc.isr_is({0, 1}))
    assert sc.produce(10, acks=1) == 10
    assert sc.run_until(lambda: sc.leo(1) == 10 and sc.hw(0) == 10)
    sc.node(0).pause()  # 0 goes on leading in its epoch, HW 10 over {0, 1}
    assert sc.wait_gone(0) and sc.run_until(lambda: sc.leader_is(1))
    sc.stop(1, "clean")  # the last ISR member: the partition goes offline
    assert sc.wait_gone(1)
    sc.start(2)
    assert sc.run_until(lambda: sc.leader_is(2))  # unclean: 2 has none of the 10
    sc.start(1)
    assert sc.run_until(lambda: sc.leo(1) < 10 and sc.part(1).leader_epoch == sc.zk().leader_epoch)
    zombie = sc.part(0)
    assert sc.node(0).paused and zombie.is_leader and set(zombie.isr) == {0, 1}
    assert sc.hw(0) == 10 and sc.leo(1) == 0  # the state the old check reported
    assert sc.cluster.checker.zombie_hw_exemptions > 0
    sc.node(0).resume()
    result = sc.finish()
    assert [str(v) for v in result.violations] == []


@pytest.mark.parametrize("seed", [263, 390, 436])
def test_regression_unclean_seeds_where_a_zombie_leader_outlived_the_unclean_election(
        seed: int) -> None:
    # The three of seeds 1-500 (3,000 events) where the exemption applies (7 of 1-1,000: also
    # 832, 891, 899, 989) since AlterPartition has its own channel to the controller, faulty in
    # random runs; each would fail ValidHighWatermark without it. Before, 336, 394 and 416;
    # at 7d1a751 (leaders writing the ISR to ZooKeeper) 95, 113 and 159: a trajectory change
    # moves them, the scripted test above does not.
    s = run_seed(seed, 3000, config=unclean_config(), allowed=UNCLEAN_ALLOWED)
    assert s.unclean_elections > 0 and s.zombie_hw_exemptions > 0
    assert s.ok, s.report()
